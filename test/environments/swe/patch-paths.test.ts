import { describe, expect, it } from 'vitest';
import { touchedPaths } from '../../../src/environments/swe/patch-paths.js';
import { editsFromPatch } from '../../../src/testing/scripted-swe-policy.js';

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
  'diff --git a/old name.py b/docs/new name.py',
  'similarity index 100%',
  'rename from old name.py',
  'rename to docs/new name.py',
  'diff --git "a/tab\\there.txt" "b/tab\\there.txt"',
  'deleted file mode 100644',
  'index 6666666..0000000',
  '--- "a/tab\\there.txt"',
  '+++ /dev/null',
  '@@ -1 +0,0 @@',
  '-gone',
  '',
].join('\n');

describe('touchedPaths (jsdiff parsePatch)', () => {
  it('lists every file of a git diff once: edited, new, binary, renamed (both names) and deleted (C-quoted name)', () => {
    expect(touchedPaths(GIT_DIFF)).toEqual(['src/pkg/core.py', 'tests/test_new.py', 'logo.png', 'old name.py', 'docs/new name.py', 'tab\there.txt']);
  });

  it('reads diff -u output with timestamps and several files without git headers', () => {
    const patch = ['--- a/x.py\t2024-01-01 00:00:00', '+++ b/x.py\t2024-01-02 00:00:00', '@@ -1 +1 @@', '-old', '+new', '--- a/y.py', '+++ b/y.py', '@@ -3,0 +4 @@', '+added', ''].join('\n');
    expect(touchedPaths(patch)).toEqual(['x.py', 'y.py']);
  });

  it('refuses a hunk cut short or holding a stray line, naming the hunk', () => {
    expect(() => touchedPaths('--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,3 @@\n a\n-b')).toThrow(/line count did not match for hunk at line 3/);
    expect(() => touchedPaths('--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n a\n*b\n')).toThrow(/Hunk at line 3 contained invalid line/);
  });
});

describe("editsFromPatch (the scripted SWE policy's str_replace calls)", () => {
  it("turns each hunk into its old and new text, a blank context line and a missing final newline included", () => {
    const edits = editsFromPatch(GIT_DIFF.split('diff --git a/tests')[0]!, '/work/testbed');
    expect(edits).toEqual([{ path: '/work/testbed/src/pkg/core.py', old_str: '    a = 1\n    b = 2\n\n    return a\n', new_str: '    a = 1\n    b = 3\n    c = 4\n\n    return a\n' }]);
    const noNewline = ['--- a/x.py', '+++ b/x.py', '@@ -1,2 +1,2 @@', ' keep', '-old', '\\ No newline at end of file', '+new', '\\ No newline at end of file', ''].join('\n');
    expect(editsFromPatch(noNewline, '/r')).toEqual([{ path: '/r/x.py', old_str: 'keep\nold', new_str: 'keep\nnew' }]);
  });

  it('refuses to add or delete whole files (not a str_replace)', () => {
    expect(() => editsFromPatch(GIT_DIFF, '/work/testbed')).toThrow(/not a str_replace/);
  });
});
