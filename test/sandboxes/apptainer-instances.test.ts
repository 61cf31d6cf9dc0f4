import { describe, expect, it } from 'vitest';
import { parseDirListing } from '../../src/sandboxes/sandbox-files.js';
import { newInstanceName, orphanedInstances, ownerOfHostDir, ownerOfInstance, parseInstanceList } from '../../src/sandboxes/apptainer-instances.js';

// `apptainer instance list --json` as Apptainer 1.x prints it (json.Encoder with a tab indent).
const DOCUMENTED = `{
\t"instances": [
\t\t{
\t\t\t"instance": "rollout-apt-777-0123456789abcdef",
\t\t\t"pid": 11963,
\t\t\t"img": "/images/python.sif",
\t\t\t"ip": "",
\t\t\t"logErrPath": "/root/.apptainer/instances/logs/host/root/rollout-apt-777-0123456789abcdef.err",
\t\t\t"logOutPath": "/root/.apptainer/instances/logs/host/root/rollout-apt-777-0123456789abcdef.out"
\t\t},
\t\t{
\t\t\t"instance": "mysql",
\t\t\t"pid": 11964,
\t\t\t"img": "/home/u/mysql.sif",
\t\t\t"ip": "10.22.0.4",
\t\t\t"logErrPath": "",
\t\t\t"logOutPath": ""
\t\t}
\t]
}
`;

describe('apptainer instance list --json parsing', () => {
  it('reads the documented format', () => {
    expect(parseInstanceList(DOCUMENTED)).toEqual([
      { name: 'rollout-apt-777-0123456789abcdef', pid: 11963, image: '/images/python.sif' },
      { name: 'mysql', pid: 11964, image: '/home/u/mysql.sif' },
    ]);
  });

  it('reads no instances as an empty list, a null list, or nothing at all', () => {
    expect(parseInstanceList('{\n\t"instances": []\n}\n')).toEqual([]);
    expect(parseInstanceList('{"instances": null}')).toEqual([]);
    expect(parseInstanceList('')).toEqual([]);
  });

  it('accepts entries without log paths (older Singularity)', () => {
    expect(parseInstanceList('{"instances":[{"instance":"a","pid":1,"img":"/a.sif","ip":""}]}')).toEqual([{ name: 'a', pid: 1, image: '/a.sif' }]);
  });

  it('fails with sandbox_error on output that is not the format, quoting it', () => {
    expect(() => parseInstanceList('INSTANCE NAME    PID    IP    IMAGE')).toThrow(expect.objectContaining({ code: 'sandbox_error' }));
    expect(() => parseInstanceList('{"instances":[{"name":"a"}]}')).toThrow(expect.objectContaining({ code: 'sandbox_error' }));
  });
});

describe('instance and host dir ownership', () => {
  it('names instances after the server pid, and reads the pid back only from our names', () => {
    const name = newInstanceName(4242);
    expect(name).toMatch(/^rollout-apt-4242-[0-9a-f]{16}$/);
    expect(ownerOfInstance(name)).toBe(4242);
    expect(ownerOfInstance('mysql')).toBeUndefined();
    expect(ownerOfInstance('rollout-apt-4242-xyz')).toBeUndefined();
    expect(ownerOfHostDir('rollout-apt-4242-AbC123')).toBe(4242);
    expect(ownerOfHostDir('rollout-sbx-AbC123')).toBeUndefined();
  });

  it('calls orphaned only our instances whose server is dead, never ours or a live server’s', () => {
    const dead = { name: newInstanceName(111), pid: 1, image: 'x' };
    const live = { name: newInstanceName(222), pid: 2, image: 'x' };
    const mine = { name: newInstanceName(process.pid), pid: 3, image: 'x' };
    const foreign = { name: 'mysql', pid: 4, image: 'x' };
    expect(orphanedInstances([dead, live, mine, foreign], (pid) => pid === 222)).toEqual([dead]);
  });
});

describe('in-instance directory listing parsing', () => {
  it('reads find -printf records, names with spaces and newlines included, sorted, sizes for files only', () => {
    expect(parseDirListing('f 5 b.txt\0d 4096 a dir\0l 7 link\0f 0 new\nline\0p 0 fifo\0', '/w', false)).toEqual([
      { name: 'a dir', type: 'dir', size: 0 },
      { name: 'b.txt', type: 'file', size: 5 },
      { name: 'fifo', type: 'other', size: 0 },
      { name: 'link', type: 'symlink', size: 0 },
      { name: 'new\nline', type: 'file', size: 0 },
    ]);
  });
});
