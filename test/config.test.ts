import { describe, expect, it } from 'vitest';
import { checkConfigShape, parseConfig } from '../src/config.js';
import { RolloutError } from '../src/errors.js';
import { MAX_TIMER_MS } from '../src/timers.js';

const failure = (input: unknown): RolloutError => {
  try {
    parseConfig(input);
  } catch (err) {
    expect(err).toBeInstanceOf(RolloutError);
    return err as RolloutError;
  }
  throw new Error('parseConfig accepted it');
};

describe('server configuration', () => {
  it.each([
    [{ prot: 50051 }, 'Unrecognized key: "prot"', ''],
    [{ init: { concurency: 8 } }, 'Unrecognized key: "concurency"', 'init'],
    [{ sandbox: { memroyMb: 512 } }, 'Unrecognized key: "memroyMb"', 'sandbox'],
    [{ defaults: { maxTurn: 3 } }, 'Unrecognized key: "maxTurn"', 'defaults'],
    [{ backends: [{ url: 'http://127.0.0.1:8000', maxConcurency: 4 }] }, 'Unrecognized key: "maxConcurency"', 'backends.0'],
    [{ model: { dri: '/models/x' } }, 'Unrecognized key: "dri"', 'model'],
  ])('refuses an unknown key at any depth, naming it: %j', (input, message, field) => {
    const err = failure(input);
    expect(err.code).toBe('invalid_argument');
    expect(err.message).toContain(message);
    expect(err.field ?? '').toBe(field);
  });

  it('says what is wrong with a value, with its path', () => {
    const err = failure({ run: { concurrency: 0 } });
    expect(err.message).toContain('at run.concurrency');
  });

  it('refuses every timeout (a *Ms field, at any depth) above what a Node timer holds, naming it; accepts the largest that fits', () => {
    // Regression: Node fires a timer of more than 2^31 - 1 ms after 1 ms, so `run.timeoutMs: 3e9` (someone's "no
    // limit") ended every sample DEADLINE_EXCEEDED at once, and a long sandbox wall clock killed every sandbox.
    const paths: string[][] = [];
    const walk = (value: unknown, path: string[]): void => {
      if (value === null || typeof value !== 'object' || Array.isArray(value)) return;
      for (const [key, child] of Object.entries(value)) {
        if (/Ms$/.test(key) && typeof child === 'number') paths.push([...path, key]);
        else walk(child, [...path, key]);
      }
    };
    walk(parseConfig({}), []);
    expect(paths.length).toBeGreaterThanOrEqual(15);
    const at = (path: string[], v: number): Record<string, unknown> => path.reduceRight<unknown>((inner, key) => ({ [key]: inner }), v) as Record<string, unknown>;
    for (const path of paths) {
      const err = failure(at(path, MAX_TIMER_MS + 1));
      expect(err.message, path.join('.')).toContain(`at ${path.join('.')}`);
      // backendBodyIdleTimeoutMs is at most backendRequestTimeoutMs (300 s by default): the largest fits when that is 0 (none).
      const beside = path.join('.') === 'backendBodyIdleTimeoutMs' ? { backendRequestTimeoutMs: 0 } : {};
      expect(() => parseConfig({ ...at(path, MAX_TIMER_MS), ...beside }), path.join('.')).not.toThrow();
    }
  });

  it('keeps the other defaults of a partially overridden object', () => {
    const defaults = parseConfig({});
    const config = parseConfig({ init: { concurrency: 8 }, run: { timeoutMs: 5 }, sandbox: { memoryMb: 512 }, defaults: { maxTurns: 3 } });
    expect(config.init).toEqual({ concurrency: 8, timeoutMs: defaults.init.timeoutMs });
    expect(config.run).toEqual({ concurrency: defaults.run.concurrency, timeoutMs: 5, toolTimeShare: defaults.run.toolTimeShare });
    expect(config.eval).toEqual(defaults.eval);
    expect(config.sandbox).toEqual({ ...defaults.sandbox, memoryMb: 512 });
    expect(config.defaults).toEqual({ ...defaults.defaults, maxTurns: 3 });
    expect(defaults.init).toEqual({ concurrency: 64, timeoutMs: 60_000 });
    expect(defaults.run).toEqual({ concurrency: 1024, timeoutMs: 600_000, toolTimeShare: 0.9 });
  });

  it('takes the model as a name or as a section whose omitted fields keep their defaults', () => {
    expect(parseConfig({}).model).toEqual({ name: 'policy', templateVariables: {} });
    expect(parseConfig({ model: 'qwen' }).model).toEqual({ name: 'qwen', templateVariables: {} });
    expect(parseConfig({ model: { dir: '/m', templateVariables: { enable_thinking: false } } }).model).toEqual({
      name: 'policy',
      dir: '/m',
      templateVariables: { enable_thinking: false },
    });
    const err = failure({ model: { toolCallParser: 'mistral' } });
    expect(err.field).toBe('model.toolCallParser');
    expect(err.message).toContain('"hermes"|"llama3_json"|"deepseek_v3"');
  });

  it('takes auth tokens and TLS files; mTLS without a client CA and empty tokens are refused by field', () => {
    const config = parseConfig({ auth: { token: 't', adminToken: 'a' }, tls: { certFile: '/c.pem', keyFile: '/k.pem' }, drainGraceMs: 5_000 });
    expect(config.auth).toEqual({ token: 't', adminToken: 'a' });
    expect(config.tls).toEqual({ certFile: '/c.pem', keyFile: '/k.pem', requireClientCert: false });
    expect(config.drainGraceMs).toBe(5_000);
    expect(parseConfig({}).auth).toEqual({});
    expect(parseConfig({}).tls).toBeUndefined();
    expect(failure({ tls: { certFile: '/c.pem', keyFile: '/k.pem', requireClientCert: true } }).field).toBe('tls.requireClientCert');
    expect(failure({ auth: { token: '' } }).field).toBe('auth.token');
    expect(failure({ auth: { tokne: 'x' } }).message).toContain('tokne');
  });

  it.each([
    ['auth.token', { auth: { token: 'secret-from-template\n' } }],
    ['auth.token', { auth: { token: 'two words' } }],
    ['auth.adminToken', { auth: { adminToken: 'caf\u00e9-secret' } }],
    ['adminToken', { adminToken: 'tab\tsecret' }],
  ])('refuses a token an HTTP/2 header cannot carry, naming %s and never quoting the token', (field, input) => {
    const err = failure(input);
    expect(err.field).toBe(field);
    expect(err.message).toContain('printable ASCII');
    expect(err.message).not.toContain('secret');
    expect(parseConfig({ auth: { token: 'A-z0-9._~+/=!#$%&*' } }).auth.token).toBe('A-z0-9._~+/=!#$%&*');
  });

  it('limits open watches (watch.maxOpen, default 64)', () => {
    expect(parseConfig({}).watch).toEqual({ maxOpen: 64, stalledMs: 60_000 });
    expect(parseConfig({}).connections).toEqual({ maxConcurrentStreams: 1024, maxUnaryInFlight: 256, maxOpen: 1024, idleTimeoutMs: 300_000, handshakeTimeoutMs: 20_000 });
    expect(parseConfig({}).calls).toEqual({ firstMessageTimeoutMs: 300_000, unaryDeadlineMs: 3_600_000, maxOpenInfrastructureStreams: 256 });
    expect(parseConfig({}).sessions).toMatchObject({ maxDetachedBytes: 1 << 30, stalledMs: 600_000, maxOpen: 4096 });
    expect(failure({ calls: { firstMessageTimeoutMs: -1 } }).field).toBe('calls.firstMessageTimeoutMs');
    expect(parseConfig({ watch: { maxOpen: 2 } }).watch.maxOpen).toBe(2);
    expect(failure({ watch: { maxOpen: -1 } }).field).toBe('watch.maxOpen');
  });

  it.each([
    ['backends', { backends: { url: 'http://127.0.0.1:8000' } }, 'expected array'],
    ['auth', { auth: ['t'] }, 'expected object'],
    ['sandbox', { sandbox: 'bwrap' }, 'expected object'],
    ['init', { init: 8 }, 'expected object'],
    ['tls', { tls: null }, 'expected object'],
    ['model', { model: 7 }, ''],
  ])('checks the shape of a config file before flags are merged into it: %s', (field, input, message) => {
    let err: unknown;
    try {
      checkConfigShape(input);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(RolloutError);
    expect((err as RolloutError).field).toBe(field);
    expect((err as RolloutError).message).toContain(message);
  });

  it('lets any well-shaped file through the shape check (values are parseConfig\'s to judge)', () => {
    expect(() => checkConfigShape({ model: 'qwen', backends: [], init: { concurrency: 0 }, tls: { certFile: '/c.pem' }, unknownKey: 1 })).not.toThrow();
  });
});
