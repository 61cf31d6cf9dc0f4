import type { RolloutClient } from '../../src/client/rollout-client.js';
import type { PoolStats, StageEvent, Trajectory, TrajectorySummary, WatchRequest, WatchResponse } from '../../gen/ts/rollout/v1/rollout.js';
import { eventually } from './wait.js';

/**
 * Records a Watch stream in the background so a test can act, then wait for what it expects to see.
 * Ask for `statsIntervalMs` and call `ready()` before acting: the first stats message proves the server has
 * subscribed this watcher to the event bus (events before that would be missed, by design of a live tail).
 */
export class WatchRecorder {
  readonly messages: WatchResponse[] = [];
  error: unknown;
  private ended = false;
  private readonly cancelCall: () => void;

  constructor(client: RolloutClient, request: Partial<WatchRequest>) {
    const stream = client.watch(request);
    this.cancelCall = stream.cancel;
    void (async () => {
      try {
        for await (const message of stream) this.messages.push(message);
      } catch (err) {
        this.error = err;
      } finally {
        this.ended = true;
      }
    })();
  }

  get stages(): StageEvent[] {
    return this.messages.flatMap((m) => (m.kind?.$case === 'stage' ? [m.kind.value] : []));
  }

  get finished(): TrajectorySummary[] {
    return this.messages.flatMap((m) => (m.kind?.$case === 'finished' ? [m.kind.value] : []));
  }

  get trajectories(): Trajectory[] {
    return this.messages.flatMap((m) => (m.kind?.$case === 'trajectory' ? [m.kind.value] : []));
  }

  get stats(): PoolStats[] {
    return this.messages.flatMap((m) => (m.kind?.$case === 'stats' ? [m.kind.value] : []));
  }

  async ready(): Promise<void> {
    await this.until(() => this.stats.length > 0, 'the first stats message');
  }

  async until(condition: () => boolean, what: string, timeoutMs = 15_000): Promise<void> {
    await eventually(() => {
      if (this.ended && !condition()) throw new Error(`watch stream ended (${String(this.error)}) before ${what}`);
      return condition();
    }, what, timeoutMs);
  }

  cancel(): void {
    this.cancelCall();
  }
}
