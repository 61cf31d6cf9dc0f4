import cliProgress from 'cli-progress';

/** Progress of one benchmark phase on stderr: a cli-progress bar on a terminal, a line every few seconds otherwise. */
export interface Progress {
  update(done: number): void;
  stop(): void;
}

export function startProgress(label: string, total: number): Progress {
  if (process.stderr.isTTY) {
    const bar = new cliProgress.SingleBar(
      { format: `${label.padEnd(34)} {bar} {value}/{total} | {duration}s`, stream: process.stderr, hideCursor: true, clearOnComplete: false },
      cliProgress.Presets.shades_classic,
    );
    bar.start(total, 0);
    return { update: (done) => bar.update(done), stop: () => bar.stop() };
  }
  const started = performance.now();
  let last = started;
  let current = 0;
  process.stderr.write(`${label}: 0/${total}\n`);
  return {
    update: (done) => {
      current = done;
      const now = performance.now();
      if (now - last < 2_000) return;
      last = now;
      process.stderr.write(`${label}: ${done}/${total} (${((now - started) / 1000).toFixed(1)} s)\n`);
    },
    stop: () => process.stderr.write(`${label}: ${current}/${total} done in ${((performance.now() - started) / 1000).toFixed(1)} s\n`),
  };
}

/** A one-line note on stderr. */
export function note(message: string): void {
  process.stderr.write(`${message}\n`);
}
