import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts', 'src/**/*.test.ts'],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: 'forks',
    // Fails the run when it leaves an image mount behind (a driver not closed), after unmounting it.
    globalSetup: ['test/support/leftovers.global.ts'],
  },
});
