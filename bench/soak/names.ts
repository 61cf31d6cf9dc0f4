/** The calc double under the soak's own name, in a null sandbox (bench/soak/server.ts registers it). */
export const SOAK_CALC_ENVIRONMENT = 'soak-calc';
/** Sandbox env variable carrying the run's tag in every bubblewrap sandbox of the soak, so leftovers can be found. */
export const RUN_TAG_ENV = 'ROLLOUT_SOAK_RUN';
/** Sandbox env variable by which the soak's environments ask for a null sandbox (read by SoakSandboxDriver). */
export const NULL_SANDBOX_ENV = 'ROLLOUT_SOAK_SANDBOX';
