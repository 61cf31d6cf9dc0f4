import { availableParallelism } from 'node:os';
import { getLlama, LlamaLogLevel, type Llama } from 'node-llama-cpp';

let shared: Promise<Llama> | undefined;

/**
 * The process's llama.cpp binding, loaded once and shared by every embedded engine (the native library keeps
 * global state, and loading it costs ~0.5 s). CPU only and offline by construction: the prebuilt binary shipped in
 * @node-llama-cpp/linux-x64 is used as it is (`build: 'never'`, `skipDownload`), never a GPU build, never a
 * download or compile at run time. `maxThreads` is the machine's cores; each context asks for its own share.
 * llama.cpp's own log goes to the console only for errors.
 */
export function loadLlamaRuntime(): Promise<Llama> {
  shared ??= getLlama({
    gpu: false,
    build: 'never',
    skipDownload: true,
    usePrebuiltBinaries: true,
    progressLogs: false,
    logLevel: LlamaLogLevel.error,
    maxThreads: availableParallelism(),
  }).catch((err: unknown) => {
    shared = undefined; // a later engine may try again
    throw err;
  });
  return shared;
}
