// Lint: typescript-eslint's recommended rules; generated code and dependencies excluded.
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['gen/**', 'node_modules/**', '.venv/**', 'dist/**', '.cache/**', 'examples/python/**'] },
  ...tseslint.configs.recommended,
  {
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      '@typescript-eslint/consistent-type-imports': 'error',
    },
  },
);
