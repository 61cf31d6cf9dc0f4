import { mkdir, mkdtemp, realpath, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config.js';
import { DEFAULT_IMAGE_CACHE_DIR } from '../../src/sandboxes/images/image-recipe.js';
import { allowedImageDirs, resolveSandboxSpec } from '../../src/sandboxes/spec.js';

// Regression: a task could name any path on the server as its image ("/" = the host's own file system, or "host"),
// so whoever held a trainer token could have the model read server files (configs with tokens) into trajectories.
describe('an image an environment asks for must lie inside sandbox.imageDirs', () => {
  let root: string;
  let allowed: string;
  let outside: string;
  const config = () => parseConfig({ sandbox: { imageDirs: [allowed] } }).sandbox;
  const refused = () => expect.objectContaining({ code: 'invalid_argument', message: expect.stringMatching(new RegExp(`${allowed}.*sandbox\\.imageDirs`)) });

  beforeAll(async () => {
    root = await realpath(await mkdtemp(join(tmpdir(), 'rollout-image-dirs-')));
    allowed = join(root, 'images');
    outside = join(root, 'secrets');
    await mkdir(join(allowed, 'rootfs'), { recursive: true });
    await mkdir(outside);
    await writeFile(join(allowed, 'task.sif'), 'not really a SIF');
    await writeFile(join(outside, 'token.sif'), 'a server secret');
    await symlink('/', join(allowed, 'host-root'));
    await symlink(join(outside, 'token.sif'), join(allowed, 'linked.sif'));
  });
  afterAll(async () => rm(root, { recursive: true, force: true }));

  it('refuses "/", "host", a symlink inside an allowed dir pointing outside, and "../" escapes', () => {
    for (const image of ['/', 'host', '/etc', join(allowed, 'host-root'), join(allowed, 'linked.sif'), join(allowed, '..', 'secrets', 'token.sif'), `${allowed}/rootfs/../../secrets`, allowed]) {
      expect(() => resolveSandboxSpec(config(), { image }, 60_000), image).toThrow(refused());
    }
  });

  it('accepts an image inside an allowed dir, as its real path', async () => {
    await symlink(join(allowed, 'task.sif'), join(allowed, 'alias.sif'));
    expect(resolveSandboxSpec(config(), { image: join(allowed, 'task.sif') }, 60_000).image).toBe(join(allowed, 'task.sif'));
    expect(resolveSandboxSpec(config(), { image: join(allowed, 'rootfs') }, 60_000).image).toBe(join(allowed, 'rootfs'));
    expect(resolveSandboxSpec(config(), { image: join(allowed, 'alias.sif') }, 60_000).image).toBe(join(allowed, 'task.sif'));
  });

  it('accepts a name that merely starts with ".." inside an allowed dir', async () => {
    await writeFile(join(allowed, '..dots.sif'), 'not really a SIF');
    expect(resolveSandboxSpec(config(), { image: join(allowed, '..dots.sif') }, 60_000).image).toBe(join(allowed, '..dots.sif'));
  });

  it('refuses a symlink loop instead of passing it on', async () => {
    await symlink(join(allowed, 'loop.sif'), join(allowed, 'loop.sif'));
    expect(() => resolveSandboxSpec(config(), { image: join(allowed, 'loop.sif') }, 60_000)).toThrow(refused());
  });

  it('leaves a missing image inside an allowed dir to the code that reports it missing', () => {
    expect(resolveSandboxSpec(config(), { image: join(allowed, 'missing.sif') }, 60_000).image).toBe(join(allowed, 'missing.sif'));
  });

  // Found by review (helper-44): a missing path outside the dirs was let through (to be reported missing) while an
  // existing one was refused, so the answer told whoever named it whether the path exists on the server.
  it('refuses a path outside the allowed dirs with one message whether it exists, is missing or cannot be read', () => {
    const images = ['/etc/passwd', '/nonexistent/task.sif', join(outside, 'token.sif'), join(outside, 'missing.sif'), '/proc/1/root/x.sif', join(outside, 'token.sif', 'x')];
    const messages = images.map((image) => {
      try {
        resolveSandboxSpec(config(), { image }, 60_000);
        return `accepted ${image}`;
      } catch (err) {
        return (err as Error).message.replace(image, '<image>');
      }
    });
    expect(new Set(messages).size, messages.join('\n')).toBe(1);
    expect(messages[0]).toMatch(/not inside an allowed directory/);
  });

  it("keeps the operator's choices: the configured default image (wherever it lies), and no image asked for", () => {
    const image = join(outside, 'token.sif');
    const withDefault = parseConfig({ sandbox: { image, imageDirs: [allowed] } }).sandbox;
    expect(resolveSandboxSpec(withDefault, undefined, 60_000).image).toBe(image);
    expect(resolveSandboxSpec(withDefault, { image }, 60_000).image).toBe(image);
    expect(() => resolveSandboxSpec(withDefault, { image: 'host' }, 60_000)).toThrow(refused());
    // No default image configured: the host's /usr when the environment asks for no image, never when it names "host".
    expect(resolveSandboxSpec(config(), undefined, 60_000).image).toBeUndefined();
    expect(() => resolveSandboxSpec(config(), { image: 'host' }, 60_000)).toThrow(refused());
  });

  it("defaults to where `rollout image build` and `rollout swe build` put images, and the configured image's dir (never /)", () => {
    const cache = dirname(DEFAULT_IMAGE_CACHE_DIR);
    expect(allowedImageDirs(parseConfig({}).sandbox)).toEqual([join(cache, 'images'), join(cache, 'swe', 'images')]);
    expect(allowedImageDirs(parseConfig({ sandbox: { image: '/srv/images/python.sif' } }).sandbox)).toEqual([join(cache, 'images'), join(cache, 'swe', 'images'), '/srv/images']);
    expect(allowedImageDirs(parseConfig({ sandbox: { image: '/python.sif' } }).sandbox)).toEqual([join(cache, 'images'), join(cache, 'swe', 'images')]);
    expect(() => resolveSandboxSpec(parseConfig({ sandbox: { image: '/python.sif' } }).sandbox, { image: '/' }, 60_000)).toThrow(expect.objectContaining({ code: 'invalid_argument' }));
  });

  it('refuses a relative imageDirs entry in the config, naming it', () => {
    expect(() => parseConfig({ sandbox: { imageDirs: ['images'] } })).toThrow(expect.objectContaining({ code: 'invalid_argument', field: 'sandbox.imageDirs.0' }));
  });
});
