import { describe, expect, it } from 'vitest';
import { parseUnifiedDiff, touchedPaths } from '../../../src/environments/swe/unified-diff.js';

const GIT_DIFF = [
  'diff --git a/src/pkg/core.py b/src/pkg/core.py',
  'index 1111111..2222222 100644',
  '--- a/src/pkg/core.py',
  '+++ b/src/pkg/core.py',
  '@@ -10,4 +10,5 @@ def f():',
  '     a = 1',
  '-    b = 2',
  '+    b = 3',
  '+    c = 4',
  '',
  '     return a',
  'diff --git a/tests/test_new.py b/tests/test_new.py',
  'new file mode 100644',
  'index 0000000..3333333',
  '--- /dev/null',
  '+++ b/tests/test_new.py',
  '@@ -0,0 +1,2 @@',
  '+def test_x():',
  '+    pass',
  '\\ No newline at end of file',
  'diff --git a/logo.png b/logo.png',
  'index 4444444..5555555 100644',
  'GIT binary patch',
  'literal 3',
  'KcmZ?wbN>JZ',
  '',
].join('\n');

describe('parseUnifiedDiff', () => {
  it('reads files and hunks of a git diff, new and binary files included', () => {
    const files = parseUnifiedDiff(GIT_DIFF);
    expect(files.map((f) => [f.oldPath, f.newPath, f.hunks.length])).toEqual([
      ['src/pkg/core.py', 'src/pkg/core.py', 1],
      ['/dev/null', 'tests/test_new.py', 1],
      ['logo.png', 'logo.png', 0],
    ]);
    expect(files[0]!.hunks[0]).toEqual({ oldStart: 10, oldText: '    a = 1\n    b = 2\n\n    return a\n', newText: '    a = 1\n    b = 3\n    c = 4\n\n    return a\n' });
    // "\ No newline at end of file" takes the newline off the line before it.
    expect(files[1]!.hunks[0]!.newText).toBe('def test_x():\n    pass');
    expect(touchedPaths(GIT_DIFF)).toEqual(['src/pkg/core.py', 'tests/test_new.py', 'logo.png']);
  });

  it('reads diff -u output with timestamps and several files without git headers', () => {
    const patch = ['--- a/x.py\t2024-01-01 00:00:00', '+++ b/x.py\t2024-01-02 00:00:00', '@@ -1 +1 @@', '-old', '+new', '--- a/y.py', '+++ b/y.py', '@@ -3,0 +4 @@', '+added', ''].join('\n');
    expect(parseUnifiedDiff(patch).map((f) => [f.newPath, f.hunks.map((h) => [h.oldText, h.newText])])).toEqual([
      ['x.py', [['old\n', 'new\n']]],
      ['y.py', [['', 'added\n']]],
    ]);
  });

  it('refuses a hunk cut short', () => {
    expect(() => parseUnifiedDiff('--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,3 @@\n a\n-b\n')).toThrow(/ends inside the hunk/);
  });
});
