import { describe, expect, it } from 'vitest';
import { testTrees } from '../../../src/environments/swe/repo-ops.js';

describe('testTrees: the directories whose files a listed test may import or read (reset with the tests)', () => {
  it.each([
    [['tests/unit/test_x.py'], ['tests']],
    [['pkg/tests/test_x.py', 'pkg/tests/sub/test_y.py'], ['pkg/tests']],
    [['a/test/b/tests/test_c.py'], ['a/test/b/tests']],
    [['numpy/testing/tests/test_utils.py'], ['numpy/testing/tests']],
    [['pkg/test_x.py', 'test_root.py'], []],
    [['pkg/testing/test_x.py', 'pkg/tests_extra/test_y.py'], []],
  ])('%j → %j', (files, trees) => {
    expect(testTrees(files)).toEqual(trees);
  });
});
