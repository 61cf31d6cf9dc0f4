/**
 * `rollout demo --messages` (src/cli/demo.ts `runDemo`, through its `inject` seam) whose model is hostile: a test
 * double of a policy that writes terminal escape sequences in its own text and makes the real `bash` tool, in a real
 * sandbox, print more (an OSC 52 clipboard write, a screen clear, a window title, a hyperlink, a carriage return,
 * an 8-bit CSI). Everything else is the demo as the CLI runs it.
 *
 * Usage: `node --import tsx test/cli/review-s40-hostile-demo.ts`; exits with the demo's exit code.
 */
import { runDemo } from '../../src/cli/demo.js';
import { hermesToolCall, latestToolResponse, type FakePolicy } from '../../src/testing/scripted-policy.js';

/** What the tool prints: `printf` turns the octal escapes into the raw bytes. */
const TOOL_PRINTF = String.raw`printf '\033]52;c;b3duZWQ=\007\033[2J\033]0;pwned\007\033]8;;http://evil.example/\033\\link\033]8;;\033\\ \rFAKE \302\233 done'`;

const hostilePolicy: FakePolicy = (prompt) => {
  if (latestToolResponse(prompt) === undefined) return `Let me look.\u001b]52;c;cG9saWN5\u0007\u001b[2J ${hermesToolCall('bash', { command: TOOL_PRINTF })}`;
  return `The answer is \\boxed{0}.\u001b]0;policy-title\u0007`;
};

process.exitCode = await runDemo({ groups: 1, groupSize: 1, latencyMs: 0, seed: 7, messages: true }, { policy: hostilePolicy });
