/**
 * The public API of rollout-service: start a server, talk to one, and the extension points (environments,
 * tools, sandbox drivers, engine clients). Everything else under src/ is internal.
 */
export { startRolloutServer, type RolloutServer, type RolloutServerOptions } from './app.js';
export { parseConfig, serverConfigSchema, type ServerConfig, type ServerConfigInput } from './config.js';
export { RolloutError, type ErrorCode } from './errors.js';
export { RolloutClient, RolloutSession, OpenTimeoutError, SubmitTimeoutError, TaskLostError, TaskRejectedError, type ConnectionOptions, type SessionOptions, type TaskInput } from './client/rollout-client.js';
export { ServerLifecycle, type LifecycleState } from './lifecycle.js';

// Environments
export type { Environment, EnvironmentContext, EvaluationContext, EpisodeOutcome, Evaluation, OpenSandbox } from './environments/types.js';
export { EnvironmentRegistry, defaultRegistry } from './environments/registry.js';
export { createMathEnvironment } from './environments/math/math-environment.js';
export { createSweEnvironment, type SweEnvironmentOptions } from './environments/swe/swe-environment.js';
export type { SweInstance } from './environments/swe/instance.js';
export { loadSweTasks, sweTaskInstance, type SweTask } from './environments/swe/pypi-tasks/task-definition.js';
export { buildTaskImage } from './environments/swe/pypi-tasks/build-task-image.js';
export { defineEnvironment, parseInstance, type EnvironmentDefinition } from './environments/define.js';
export { createCodeEnvironment } from './environments/code/code-environment.js';
export { loadCodeTasks, loadHumanEval, findHumanEvalData, type CodeTaskRow } from './environments/code/dataset.js';
export { createStemEnvironment } from './environments/stem/stem-environment.js';
export { mathjsUnits, type Unit, type UnitSystem } from './environments/stem/units.js';
export type { JsonObject, JsonValue } from './environments/json.js';
export type { SandboxRequest } from './sandboxes/spec.js';

// Tools
export type { Tool, ToolCall, ToolCallParser, ToolContext, ToolResult, ParsedToolCalls } from './tools/types.js';
export { defineTool } from './tools/define-tool.js';
export { ToolRegistry, defaultToolRegistry } from './tools/registry.js';
export { HermesToolCallParser } from './tools/hermes-parser.js';

// Sandboxes
export type { Sandbox, SandboxDriver, SandboxLimits, ExecOptions, ExecResult } from './sandboxes/types.js';
export { BubblewrapDriver } from './sandboxes/bwrap.js';

// Engines and routing
export type { EngineClient, GenerateRequest, GenerateResult, BackendKind, PauseMode, EngineModelInfo, TokenIds } from './backends/types.js';
export { VllmClient } from './backends/vllm-client.js';
export { SglangClient } from './backends/sglang-client.js';
export { BACKEND_KIND_NAMES, backendKind, createEngineClient, type BackendCapabilities, type BackendKindEntry } from './backends/kinds.js';
export { BackendPool } from './backends/pool.js';

// Tokens
export type { ChatMessage, ChatTemplate, TextPart, Tokenizer, ToolSchema } from './tokens/types.js';
export { TokenLedger } from './tokens/ledger.js';
export { loadQwen3, loadTokenizerBundle } from './tokens/tokenizer.js';
