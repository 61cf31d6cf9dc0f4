import { describe, expect, it } from 'vitest';
import { gradeTests, parsePytestReport } from '../../../src/environments/swe/grading.js';

describe('SWE-bench grading', () => {
  it('passes on passed, xpass and xfail; fails on failed, error, skipped and never reported', () => {
    const grade = gradeTests(
      { 'a.py::ok': 'passed', 'a.py::xp': 'xpass', 'a.py::xf': 'xfail', 'a.py::bad': 'failed', 'a.py::err': 'error', 'a.py::skip': 'skipped' },
      ['a.py::ok', 'a.py::xf'],
      ['a.py::xp', 'a.py::bad', 'a.py::err', 'a.py::gone', 'a.py::skip'],
    );
    expect(grade.failToPass).toMatchObject({ fraction: 1, success: ['a.py::ok', 'a.py::xf'], failure: [] });
    expect(grade.passToPass).toMatchObject({ success: ['a.py::xp'], failure: ['a.py::bad', 'a.py::err', 'a.py::gone', 'a.py::skip'], skipped: ['a.py::skip'], fraction: 0.2 });
    expect(grade.passToPass.statuses['a.py::gone']).toBe('missing');
    expect(grade.resolved).toBe(false);
  });

  it('is resolved only when both lists pass; an empty list counts as passing', () => {
    expect(gradeTests({ 't::a': 'passed' }, ['t::a'], []).resolved).toBe(true);
    expect(gradeTests({ 't::a': 'passed', 't::b': 'failed' }, ['t::a'], ['t::b']).resolved).toBe(false);
    expect(gradeTests({}, ['t::a'], []).resolved).toBe(false);
  });

  // Found by review (helper-37): skipped tests counted neither way and an empty count made the fraction 1, so a patch
  // that made the FAIL_TO_PASS tests skip (its code raising unittest.SkipTest or pytest.skip.Exception, a conftest
  // marking them skip) was resolved without fixing anything. A FAIL_TO_PASS test must pass: a skip is a failure.
  it('counts a skipped FAIL_TO_PASS test as failing: a patch that skips them is not resolved', () => {
    const allSkipped = gradeTests({ 't::a': 'skipped', 't::b': 'skipped', 't::c': 'passed' }, ['t::a', 't::b'], ['t::c']);
    expect(allSkipped.failToPass).toMatchObject({ success: [], failure: ['t::a', 't::b'], skipped: ['t::a', 't::b'], fraction: 0 });
    expect(allSkipped.failToPass.statuses).toEqual({ 't::a': 'skipped', 't::b': 'skipped' });
    expect(allSkipped.resolved).toBe(false);
    const oneSkipped = gradeTests({ 't::a': 'passed', 't::b': 'skipped' }, ['t::a', 't::b'], []);
    expect(oneSkipped.failToPass).toMatchObject({ success: ['t::a'], failure: ['t::b'], fraction: 0.5 });
    expect(oneSkipped.resolved).toBe(false);
  });

  // Found by review (helper-44): a skipped PASS_TO_PASS test counted neither way, so a patch that broke one could hide
  // it by making it skip (and a list of skips counted as all passing).
  it('counts a skipped PASS_TO_PASS test as failing: a patch cannot hide a test it broke by making it skip', () => {
    const hidden = gradeTests({ 't::fixed': 'passed', 't::broken': 'skipped' }, ['t::fixed'], ['t::broken']);
    expect(hidden.passToPass).toMatchObject({ success: [], failure: ['t::broken'], skipped: ['t::broken'], fraction: 0 });
    expect(hidden.resolved).toBe(false);
  });

  it('does not take inherited object keys for test names', () => {
    expect(gradeTests({}, ['constructor', '__proto__'], []).failToPass.failure).toEqual(['constructor', '__proto__']);
  });

  it("validates the plugin's report, which ran next to the agent's code", () => {
    expect(parsePytestReport('{"version":1,"exitstatus":1,"tests":{"t.py::a[x y]":"failed"},"collect_errors":[]}').tests).toEqual({ 't.py::a[x y]': 'failed' });
    expect(() => parsePytestReport('{"version":1,"exitstatus":0,"tests":{"t.py::a":"great"}}')).toThrow(expect.objectContaining({ code: 'environment_error' }));
    expect(() => parsePytestReport('not json')).toThrow(/not JSON/);
  });
});
