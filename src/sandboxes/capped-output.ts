/**
 * Keeps the first `limit` bytes written to it and only counts the rest.
 *
 * Why: a sandboxed program can print gigabytes; the host must drain the pipe (or the program blocks, and a
 * blocked program looks like a hang) but must never hold more than the limit in memory. Invariant:
 * `kept bytes <= limit` at all times, and `keptBytes + droppedBytes` equals everything pushed.
 */
export class CappedOutput {
  private readonly chunks: Buffer[] = [];
  private kept = 0;
  private dropped = 0;

  constructor(private readonly limit: number) {}

  /** The most bytes kept. */
  get limitBytes(): number {
    return this.limit;
  }

  push(chunk: Buffer): void {
    const room = this.limit - this.kept;
    if (room >= chunk.length) {
      this.chunks.push(chunk);
      this.kept += chunk.length;
      return;
    }
    if (room > 0) {
      this.chunks.push(chunk.subarray(0, room));
      this.kept += room;
    }
    this.dropped += chunk.length - Math.max(room, 0);
  }

  get truncated(): boolean {
    return this.dropped > 0;
  }

  get droppedBytes(): number {
    return this.dropped;
  }

  /** The kept bytes as UTF-8; a multi-byte character cut at the limit decodes as U+FFFD. */
  text(): string {
    return Buffer.concat(this.chunks, this.kept).toString('utf8');
  }
}
