import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

/** PEM files made for one test run (paths, and the contents the TypeScript client takes). */
export interface TestCerts {
  dir: string;
  caFile: string;
  serverCertFile: string;
  serverKeyFile: string;
  clientCertFile: string;
  clientKeyFile: string;
  ca: Buffer;
  clientCert: Buffer;
  clientKey: Buffer;
  /** A client certificate from another CA the server does not trust. */
  strangerCert: Buffer;
  strangerKey: Buffer;
  remove(): Promise<void>;
}

/**
 * A throwaway CA, a server certificate for 127.0.0.1/localhost and client certificates (one from the CA, one from a
 * stranger CA), made with the machine's openssl at test time: no certificate is committed, nothing leaves the
 * machine. EC P-256 keys, valid for a day.
 */
export async function makeTestCerts(): Promise<TestCerts> {
  const dir = await mkdtemp(join(tmpdir(), 'rollout-certs-'));
  const f = (name: string): string => join(dir, name);
  const openssl = (...args: string[]) => run('openssl', args, { cwd: dir });
  const key = (name: string) => openssl('ecparam', '-name', 'prime256v1', '-genkey', '-noout', '-out', f(name));
  const ca = async (name: string, cn: string): Promise<void> => {
    await key(`${name}.key`);
    await openssl('req', '-x509', '-new', '-key', f(`${name}.key`), '-sha256', '-days', '1', '-subj', `/CN=${cn}`, '-out', f(`${name}.pem`));
  };
  // Serials are random: the CA signs its two leaves at once, so a shared serial file would race.
  const leaf = async (name: string, cn: string, caName: string, ext: string): Promise<void> => {
    await key(`${name}.key`);
    await openssl('req', '-new', '-key', f(`${name}.key`), '-subj', `/CN=${cn}`, '-out', f(`${name}.csr`));
    await writeFile(f(`${name}.ext`), ext);
    await openssl('x509', '-req', '-in', f(`${name}.csr`), '-CA', f(`${caName}.pem`), '-CAkey', f(`${caName}.key`), '-set_serial', String(Math.floor(Math.random() * 2 ** 48)), '-days', '1', '-sha256', '-extfile', f(`${name}.ext`), '-out', f(`${name}.pem`));
  };
  await Promise.all([ca('ca', 'rollout test CA'), ca('stranger-ca', 'some other CA')]);
  await Promise.all([
    leaf('server', 'localhost', 'ca', 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n'),
    leaf('client', 'trainer', 'ca', 'extendedKeyUsage=clientAuth\n'),
    leaf('stranger', 'stranger', 'stranger-ca', 'extendedKeyUsage=clientAuth\n'),
  ]);
  const read = (name: string) => readFile(f(name));
  return {
    dir,
    caFile: f('ca.pem'),
    serverCertFile: f('server.pem'),
    serverKeyFile: f('server.key'),
    clientCertFile: f('client.pem'),
    clientKeyFile: f('client.key'),
    ca: await read('ca.pem'),
    clientCert: await read('client.pem'),
    clientKey: await read('client.key'),
    strangerCert: await read('stranger.pem'),
    strangerKey: await read('stranger.key'),
    remove: () => rm(dir, { recursive: true, force: true }),
  };
}
