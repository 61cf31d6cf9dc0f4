import { describe, expect, it } from 'vitest';
import { startServerHarness } from '../support/server-harness.js';
import { eventually } from '../support/wait.js';
import { WatchRecorder } from '../support/watch-recorder.js';

// rollout_backend_healthy against a real server, its real health probes and the fake vLLM engine (a test double whose
// GET /health answers 503 on cue). The metric says "usable", as ListBackends' and Watch stats' `healthy` do.

describe('rollout_backend_healthy', () => {
  it('is 0 for an engine held after it was down (weights unknown), as ListBackends and Watch say; 1 again once a resume confirms it', async () => {
    const h = await startServerHarness({ config: { metrics: { port: 0 } } });
    try {
      const scrape = async (): Promise<string> => (await fetch(`http://${h.server.metrics!.address}/metrics`)).text();
      const [backend] = await h.client.listBackends();
      const id = backend!.id;
      const healthyMetric = async (): Promise<number> => Number(new RegExp(`^rollout_backend_healthy\\{backend="${id}"\\} (\\S+)$`, 'm').exec(await scrape())?.[1]);
      expect(await healthyMetric()).toBe(1);
      // A weight sync (version 2), then the engine goes down and comes back: nothing says it kept its weights.
      await h.client.resumeGeneration({ policyVersion: 2 });
      h.engine.setHealthy(false);
      await eventually(async () => {
        await h.server.pool.probeHealth();
        return h.server.pool.list()[0]!.healthy === false;
      }, 'the engine found down by its probes');
      h.engine.setHealthy(true);
      await eventually(async () => {
        await h.server.pool.probeHealth();
        return h.server.pool.list()[0]!.healthy;
      }, 'the engine found up again by its probes');
      const listed = (await h.client.listBackends()).find((b) => b.id === id);
      expect(listed).toMatchObject({ healthy: false, weightsUnknown: true });
      const watch = new WatchRecorder(h.client, { statsIntervalMs: 100 });
      try {
        await watch.ready();
        expect(watch.stats[0]!.backendDetails.find((b) => b.id === id)).toMatchObject({ healthy: false, weightsUnknown: true });
      } finally {
        watch.cancel();
      }
      const text = await scrape();
      expect(text).toMatch(new RegExp(`^rollout_backend_weights_unknown\\{backend="${id}"\\} 1$`, 'm'));
      // It takes no trajectory: not usable, so not counted healthy (a dashboard's count of usable engines).
      expect(await healthyMetric()).toBe(0);
      await h.client.resumeGeneration({ policyVersion: 3 });
      expect((await h.client.listBackends()).find((b) => b.id === id)).toMatchObject({ healthy: true, weightsUnknown: false });
      expect(await healthyMetric()).toBe(1);
    } finally {
      await h.close();
    }
  }, 60_000);
});
