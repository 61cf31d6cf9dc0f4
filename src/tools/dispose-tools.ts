import type { Logger } from '../observability/logger.js';
import type { Tool } from './types.js';

/**
 * Ends the per-sample life of a sample's tools: calls `dispose()` on each tool that has one, all of them even
 * when some fail. Never throws: a tool that fails to clean up is logged (with the tool's name), because the
 * sample's own result — success or the error that ended it — must not be replaced by a cleanup failure.
 *
 * @example
 * const tools = environment.tools(instance);
 * try { ... } finally { await disposeTools(tools, log); }
 */
export async function disposeTools(tools: readonly Tool[], log?: Logger): Promise<void> {
  await Promise.all(
    tools.map(async (tool) => {
      if (!tool.dispose) return;
      try {
        await tool.dispose();
      } catch (err) {
        log?.error({ err, tool: tool.name }, 'disposing a tool failed');
      }
    }),
  );
}
