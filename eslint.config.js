// Lint: typescript-eslint's recommended rules plus type-aware promise rules (a floating or misused promise can
// take the process down with an unhandled rejection); generated code and dependencies excluded.
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['gen/**', 'node_modules/**', '.venv*/**', 'dist/**', '.cache/**', 'examples/python/**'] },
  ...tseslint.configs.recommended,
  {
    languageOptions: {
      parserOptions: {
        projectService: {
          // The .mjs files are worker-thread entries (they register tsx before importing TypeScript) and test workers:
          // nine small files, just over typescript-eslint's default of eight for the default project.
          allowDefaultProject: ['vitest.config.ts', 'eslint.config.js', 'bin/*.js', 'src/tokens/*.mjs', 'src/backends/embedded/*.mjs', 'src/environments/math/*.mjs', 'test/support/*.mjs'],
          maximumDefaultProjectFileMatchCount_THIS_WILL_SLOW_DOWN_LINTING: 16,
        },
        tsconfigRootDir: import.meta.dirname,
      },
    },
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      '@typescript-eslint/consistent-type-imports': 'error',
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-misused-promises': 'error',
      '@typescript-eslint/await-thenable': 'error',
      '@typescript-eslint/require-await': 'off',
    },
  },
);
