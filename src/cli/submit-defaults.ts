// Defaults of `rollout submit` that its flags show (main.ts reads them without loading the submit command itself).

/**
 * Two retries: a transient fault (an engine restarting, a node's sandbox hiccup) rarely hits one row three times, while a
 * row that fails three times is most likely broken for a reason a retry will not mend (and each attempt costs a group).
 */
export const DEFAULT_RETRIES = 2;

/**
 * Ten minutes of refusals: a server restarting (journal replay), a rolling drain behind a proxy or a journal disk briefly
 * full outlasts the Python client's one minute, and a dataset run is unattended; a server still refusing after that is
 * down for a reason someone must look at.
 */
export const DEFAULT_RETRY_REFUSED_FOR_S = 600;
