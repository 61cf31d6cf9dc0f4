import type { Logger } from '../observability/logger.js';
import type { Tool } from './types.js';

/** How long one tool's `dispose()` may take before the sample stops waiting for it. */
export const DISPOSE_TIMEOUT_MS = 10_000;

/**
 * Ends the per-sample life of a sample's tools: calls `dispose()` on each tool that has one, all of them even
 * when some fail. Never throws, and never waits past `timeoutMs` for a tool: a tool that fails to clean up, or
 * hangs at it, is logged (with the tool's name) and left behind, because the sample's own result — success or the
 * error that ended it — must not be replaced by a cleanup failure (a hang would hold it until its stage deadline
 * turned it into a TIMEOUT).
 *
 * @example
 * const tools = environment.tools(instance);
 * try { ... } finally { await disposeTools(tools, log); }
 */
export async function disposeTools(tools: readonly Tool[], log?: Logger, { timeoutMs = DISPOSE_TIMEOUT_MS }: { timeoutMs?: number } = {}): Promise<void> {
  await Promise.all(
    tools.map(async (tool) => {
      if (!tool.dispose) return;
      let timer: NodeJS.Timeout | undefined;
      const late = new Promise<'late'>((resolve) => (timer = setTimeout(() => resolve('late'), timeoutMs)));
      try {
        if ((await Promise.race([tool.dispose(), late])) === 'late') log?.error({ tool: tool.name, timeoutMs }, 'disposing a tool did not finish in time; left behind');
      } catch (err) {
        log?.error({ err, tool: tool.name }, 'disposing a tool failed');
      } finally {
        clearTimeout(timer);
      }
    }),
  );
}
