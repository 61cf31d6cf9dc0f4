#!/usr/bin/env node
// The `rollout` CLI. Runs the TypeScript sources through tsx's loader (no build step to forget).
import { register } from 'tsx/esm/api';

register();
await import('../src/cli/main.ts');
