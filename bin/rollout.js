#!/usr/bin/env -S node --max-semi-space-size=64
// The `rollout` CLI. Runs the TypeScript sources through tsx's loader (no build step to forget). The node flags on
// the first line are src/cli/node-flags.ts's (a test keeps them equal).
import { register } from 'tsx/esm/api';

register();
await import('../src/cli/main.ts');
