import { setMaxListeners } from 'node:events';
import { BehaviorSubject, filter, firstValueFrom } from 'rxjs';
import { RolloutError } from './errors.js';

/**
 * Where the server is in its life, in one place that every part follows (temporal's worker `State`):
 * starting → running → draining → drained → stopped, or failed from any state before stopped.
 * - running: tasks are admitted.
 * - draining: no task is admitted (`admission` has fired); work in flight finishes or, past the grace period, is
 *   cancelled; health says NOT_SERVING.
 * - drained: every admitted sample has ended and was handed to its sinks; `signal` has fired, so every handler
 *   flushes what it holds and ends its call with UNAVAILABLE.
 * - stopped: the transport is closed and every sandbox, engine client and token thread released.
 */
export type LifecycleState = 'starting' | 'running' | 'draining' | 'drained' | 'stopped' | 'failed';

const NEXT: Readonly<Record<LifecycleState, readonly LifecycleState[]>> = {
  starting: ['running', 'failed'],
  running: ['draining', 'failed'],
  draining: ['drained', 'failed'],
  drained: ['stopped', 'failed'],
  stopped: [],
  failed: [],
};
const ORDER: readonly LifecycleState[] = ['starting', 'running', 'draining', 'drained', 'stopped'];

/**
 * The server's lifecycle state and the two signals derived from it:
 * - `admission` fires when draining begins (reason: UNAVAILABLE "server is draining"): whatever waits to be
 *   admitted gives up, and `admitting` turns false.
 * - `signal`, the one server-lifetime signal, fires when the server stops serving (drained, or failed): every
 *   handler (Rollout streams, Watch, waiting unary calls) ends with its reason, UNAVAILABLE.
 * Transitions are checked: an illegal one is a bug and throws.
 */
export class ServerLifecycle {
  readonly state$ = new BehaviorSubject<LifecycleState>('starting');
  private readonly admissionController = new AbortController();
  private readonly lifetimeController = new AbortController();

  constructor() {
    // Every waiting submit and every open call listens to these for the server's life: many listeners by design
    // (each removed when its call ends), not a leak to warn about.
    setMaxListeners(0, this.admissionController.signal, this.lifetimeController.signal);
  }
  /** When draining: the time (Unix ms) past which the work in flight is cancelled. */
  drainDeadline: number | undefined;

  get state(): LifecycleState {
    return this.state$.value;
  }

  /** Fires when draining begins (or the server fails). */
  get admission(): AbortSignal {
    return this.admissionController.signal;
  }

  /** The server-lifetime signal: fires once the server stops serving (drained or failed). */
  get signal(): AbortSignal {
    return this.lifetimeController.signal;
  }

  /** True while tasks may be admitted. */
  get admitting(): boolean {
    return this.state === 'running';
  }

  /** Moves to `to`; throws RolloutError('internal') on a transition the lifecycle does not have. */
  transition(to: LifecycleState): void {
    const from = this.state;
    if (!NEXT[from].includes(to)) throw new RolloutError('internal', `illegal lifecycle transition ${from} → ${to}`);
    if (to === 'draining' || to === 'failed') this.admissionController.abort(new RolloutError('unavailable', 'server is draining: not accepting new tasks'));
    if (to === 'drained' || to === 'failed') this.lifetimeController.abort(new RolloutError('unavailable', 'server is shutting down'));
    this.state$.next(to);
    if (to === 'stopped' || to === 'failed') this.state$.complete();
  }

  /** True once the lifecycle is at or past `state` (failed counts as past everything). */
  reached(state: LifecycleState): boolean {
    if (this.state === 'failed') return true;
    return ORDER.indexOf(this.state) >= ORDER.indexOf(state);
  }

  /** Resolves once the lifecycle is at or past `state` (or failed). */
  async until(state: LifecycleState): Promise<void> {
    if (this.reached(state)) return;
    await firstValueFrom(this.state$.pipe(filter(() => this.reached(state))), { defaultValue: undefined });
  }
}
