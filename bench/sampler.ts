import type { ChildHandle } from './child-rpc.js';
import type { LiveCounts } from './drive.js';
import type { ServerApi, ServerInfo } from './server-child.js';

/** What the server held while a pass ran, sampled from its own counters. */
export interface InFlightSamples {
  samples: number;
  /** Samples in the pipeline (queued or in a stage). */
  meanTrajectories: number;
  maxTrajectories: number;
  /** Requests routed to the engine and not answered yet (running plus queued for a backend slot). */
  meanEngineRequests: number;
  maxEngineRequests: number;
  /** Samples inside the run stage (the agent loop). */
  meanRunning: number;
  /**
   * Trajectories the client has submitted that the server has not admitted yet (still in the request stream:
   * client buffers, HTTP/2 windows, grpc-js) and trajectories the server has finished that the client has not
   * received yet (outbound stream). Together with `meanTrajectories` they add up to the client's window.
   */
  meanInbound: number;
  meanOutbound: number;
}

/**
 * Polls the server child's counters every `intervalMs` until stopped, to show how many trajectories were really
 * in flight during a pass (the client's window is an upper bound, not a measurement).
 */
export async function sampleInFlight(server: ChildHandle<ServerApi, ServerInfo>, live: LiveCounts, intervalMs = 250): Promise<{ stop: () => Promise<InFlightSamples> }> {
  const completedBase = (await server.call('stats')).completedTotal;
  const inbound: number[] = [];
  const outbound: number[] = [];
  const trajectories: number[] = [];
  const requests: number[] = [];
  const running: number[] = [];
  let stopped = false;
  const loop = (async () => {
    while (!stopped) {
      const s = await server.call('stats');
      const completed = s.completedTotal - completedBase;
      inbound.push(live.submitted - completed - s.inFlight);
      outbound.push(completed - live.received);
      trajectories.push(s.inFlight);
      requests.push(s.pool.inflightRequests);
      running.push(s.stages.find((x) => x.stage === 'run')?.active ?? 0);
      await new Promise((resolve) => setTimeout(resolve, intervalMs));
    }
  })();
  const mean = (xs: number[]): number => (xs.length === 0 ? 0 : xs.reduce((a, b) => a + b, 0) / xs.length);
  return {
    stop: async () => {
      stopped = true;
      await loop;
      // Means over the whole pass, ramp-down at the end included.
      return {
        samples: trajectories.length,
        meanTrajectories: mean(trajectories),
        maxTrajectories: Math.max(0, ...trajectories),
        meanEngineRequests: mean(requests),
        maxEngineRequests: Math.max(0, ...requests),
        meanRunning: mean(running),
        meanInbound: mean(inbound),
        meanOutbound: mean(outbound),
      };
    },
  };
}
