import { statSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { evaluatePatch } from '../../../src/environments/swe/evaluate-patch.js';
import { validateSweInstance, type SweInstance } from '../../../src/environments/swe/instance.js';
import type { Evaluation } from '../../../src/environments/types.js';
import { sweRepo } from '../../support/swe-repo.js';

/**
 * Ways an agent's patch can forge reward 1 without fixing anything, each run for real: the patch applied in a
 * bubblewrap sandbox of the SWE base image (Debian python3, pytest, git), then pytest with the report plugin. Every
 * forging patch here leaves add() broken, so the only honest reward is 0. Found by review (helper-44): every vector
 * below but the last two gave reward 1 (or, deleting the started marker, an ENVIRONMENT_ERROR the trainer drops).
 */
const ADD = 'tests/test_calc.py::test_add';
const MUL = 'tests/test_calc.py::test_mul';

const REPO = {
  // Package metadata a develop install leaves in the image, ignored by git: the image's own, never reset.
  '.gitignore': '*.egg-info/\n',
  'calc.egg-info/PKG-INFO': 'Metadata-Version: 2.1\nName: calc\nVersion: 1.0\n',
  'setup.cfg': '[metadata]\nname = calc\n',
  'calc.py': 'def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n',
  'tests/__init__.py': '',
  'tests/test_calc.py': 'from calc import add, mul\n\n\ndef test_add():\n    assert add(2, 2) == 4\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n',
  // A helper module tests import (its expected values), and a listed test beside the code (no test tree).
  'tests/helpers.py': 'def expected_sum(a, b):\n    return a + b\n',
  'tests/test_sum.py': 'from calc import add\nfrom tests.helpers import expected_sum\n\n\ndef test_sum():\n    assert add(2, 3) == expected_sum(2, 3)\n',
  'test_beside.py': 'from calc import add\n\n\ndef test_beside():\n    assert add(1, 1) == 2\n',
};

const FIX = ['diff --git a/calc.py b/calc.py', '--- a/calc.py', '+++ b/calc.py', '@@ -1,2 +1,2 @@', ' def add(a, b):', '-    return a - b', '+    return a + b', ''].join('\n');

/** A test command that imports the package before it runs pytest. */
const IMPORT_THEN_PYTEST = 'python3 -c "import calc" && python3 -m pytest -p no:cacheprovider tests';

/** A git diff adding `path` with `text`. */
function newFile(path: string, text: string): string {
  const lines = text.replace(/\n$/, '').split('\n');
  return [`diff --git a/${path} b/${path}`, 'new file mode 100644', '--- /dev/null', `+++ b/${path}`, `@@ -0,0 +1,${lines.length} @@`, ...lines.map((l) => `+${l}`), ''].join('\n');
}

/** A git diff adding `path` as a symbolic link to `target`. */
function newSymlink(path: string, target: string): string {
  return [`diff --git a/${path} b/${path}`, 'new file mode 120000', '--- /dev/null', `+++ b/${path}`, '@@ -0,0 +1 @@', `+${target}`, '\\ No newline at end of file', ''].join('\n');
}

/** A git diff deleting the fixture's `path`. */
function deleteFile(path: keyof typeof REPO): string {
  const header = [`diff --git a/${path} b/${path}`, 'deleted file mode 100644'];
  if (REPO[path] === '') return [...header, ''].join('\n');
  const lines = REPO[path].replace(/\n$/, '').split('\n');
  return [...header, `--- a/${path}`, '+++ /dev/null', `@@ -1,${lines.length} +0,0 @@`, ...lines.map((l) => `-${l}`), ''].join('\n');
}

/** A git diff appending `lines` to calc.py (the package under test). */
function appendToCalc(lines: string[]): string {
  const tail = ['', '', 'def mul(a, b):', '    return a * b'];
  return ['diff --git a/calc.py b/calc.py', '--- a/calc.py', '+++ b/calc.py', `@@ -3,4 +3,${4 + lines.length} @@`, ...tail.map((l) => ` ${l}`), ...lines.map((l) => `+${l}`), ''].join('\n');
}

/** A pytest plugin (as a conftest or a module) that reports every test passed. */
const MARK_PASSED = [
  'import pytest',
  '',
  '',
  '@pytest.hookimpl(hookwrapper=True)',
  'def pytest_runtest_makereport(item, call):',
  '    outcome = yield',
  '    outcome.get_result().outcome = "passed"',
  '',
].join('\n');

/** Python that writes a report saying every listed test passed to the plugin's report file. */
const FORGED_REPORT = `open(os.environ["ROLLOUT_SWE_REPORT"], "w").write(json.dumps({"version": 1, "exitstatus": 0, "tests": {"${ADD}": "passed", "${MUL}": "passed"}, "collect_errors": []}))`;

describe.runIf(process.getuid?.() === 0 || process.env.CI)('a patch that forges the SWE reward', () => {
  const fx = sweRepo('rollout-swe-forgery-', REPO);

  async function evaluate(patch: string, fields: Record<string, unknown> = {}, testTimeoutMs = 60_000): Promise<Evaluation> {
    const sandbox = await fx.start();
    const instance: SweInstance = validateSweInstance({
      image: fx.image,
      problem_statement: 'add subtracts',
      test_command: 'python3 -m pytest -p no:cacheprovider tests',
      FAIL_TO_PASS: [ADD],
      PASS_TO_PASS: [MUL],
      ...fields,
    });
    return evaluatePatch(sandbox, instance, patch, { testTimeoutMs });
  }

  it("still rewards the honest fix, resetting nothing (the image's ignored egg-info included)", async () => {
    const result = await evaluate(FIX);
    expect(result).toMatchObject({ reward: 1, report: { resolved: true, test_infrastructure_reset: [] } });
    // With test infrastructure beside it, the fix is graded alone.
    const both = await evaluate(`${FIX}${newFile('conftest.py', MARK_PASSED)}`);
    expect(both).toMatchObject({ reward: 1, report: { resolved: true, test_infrastructure_reset: ['conftest.py'] } });
  }, 120_000);

  it('gives 0 to a patch that edits the listed tests themselves, in files no test patch resets', async () => {
    const edit = ['diff --git a/tests/test_calc.py b/tests/test_calc.py', '--- a/tests/test_calc.py', '+++ b/tests/test_calc.py', '@@ -4,2 +4,2 @@', ' def test_add():', '-    assert add(2, 2) == 4', '+    assert True', ''].join('\n');
    const result = await evaluate(edit);
    // patch(1) applied it (a .orig beside): that backup lies in the test tree, so it goes too.
    expect(result).toMatchObject({ reward: 0, report: { resolved: false, test_infrastructure_reset: ['tests/test_calc.py', 'tests/test_calc.py.orig'] } });
    expect(result.report.FAIL_TO_PASS).toMatchObject({ statuses: { [ADD]: 'failed' } });
  }, 120_000);

  it("gives 0 to a patch that edits a helper module in the listed tests' test directory (tests/helpers.py), and still rewards the fix", async () => {
    const SUM = 'tests/test_sum.py::test_sum';
    const fields = { FAIL_TO_PASS: [SUM], PASS_TO_PASS: [MUL] };
    const helper = ['diff --git a/tests/helpers.py b/tests/helpers.py', '--- a/tests/helpers.py', '+++ b/tests/helpers.py', '@@ -1,2 +1,2 @@', ' def expected_sum(a, b):', '-    return a + b', '+    return a - b', ''].join('\n');
    const forged = await evaluate(helper, fields);
    expect(forged).toMatchObject({ reward: 0, report: { resolved: false, test_infrastructure_reset: ['tests/helpers.py'] } });
    expect(forged.report.FAIL_TO_PASS).toMatchObject({ statuses: { [SUM]: 'failed' } });
    // A new module the patch adds there is removed too; the fix beside it is graded alone.
    const fixed = await evaluate(`${FIX}${newFile('tests/more_helpers.py', 'X = 1\n')}`, fields);
    expect(fixed).toMatchObject({ reward: 1, report: { resolved: true, test_infrastructure_reset: ['tests/more_helpers.py'] } });
  }, 120_000);

  it('a listed test beside the code (no test directory) makes no test tree: the fix of the module beside it is graded, not reset', async () => {
    const BESIDE = 'test_beside.py::test_beside';
    const result = await evaluate(FIX, { test_command: 'python3 -m pytest -p no:cacheprovider test_beside.py tests', FAIL_TO_PASS: [BESIDE], PASS_TO_PASS: [MUL] });
    expect(result).toMatchObject({ reward: 1, report: { resolved: true, test_infrastructure_reset: [] } });
  }, 120_000);

  it('gives 0 to a conftest.py (at the root or beside the tests) that marks every test passed: reset before the tests run', async () => {
    for (const path of ['conftest.py', 'tests/conftest.py']) {
      const result = await evaluate(newFile(path, MARK_PASSED));
      expect(result, path).toMatchObject({ reward: 0, report: { resolved: false, test_infrastructure_reset: [path] } });
      expect(result.report.FAIL_TO_PASS, path).toMatchObject({ statuses: { [ADD]: 'failed' } });
    }
  }, 120_000);

  it('gives 0 to a conftest.py that rewrites the report after the session', async () => {
    const result = await evaluate(newFile('conftest.py', ['import json', 'import os', '', '', 'def pytest_unconfigure(config):', `    ${FORGED_REPORT}`].join('\n')));
    expect(result).toMatchObject({ reward: 0, report: { test_infrastructure_reset: ['conftest.py'] } });
  }, 120_000);

  it('gives 0 to a pytest configuration (pytest.ini, tox.ini, setup.cfg, pyproject.toml, pytest 9\'s pytest.toml) whose addopts load a plugin of the patch', async () => {
    const configs: Record<string, string> = {
      'pytest.ini': '[pytest]\naddopts = -p forge_plugin\n',
      // The image's pytest (Debian's 7.2) does not read it; pytest >= 9 in a user's image would: reset all the same.
      '.pytest.toml': '[pytest]\naddopts = ["-p", "forge_plugin"]\n',
      'tox.ini': '[pytest]\naddopts = -p forge_plugin\n',
      'pyproject.toml': '[tool.pytest.ini_options]\naddopts = "-p forge_plugin"\n',
    };
    // setup.cfg is the image's own: edited, not added, and put back as the image has it.
    const editSetupCfg = ['diff --git a/setup.cfg b/setup.cfg', '--- a/setup.cfg', '+++ b/setup.cfg', '@@ -1,2 +1,4 @@', ' [metadata]', ' name = calc', '+[tool:pytest]', '+addopts = -p forge_plugin', ''].join('\n');
    const patches = { ...Object.fromEntries(Object.entries(configs).map(([path, text]) => [path, newFile(path, text)])), 'setup.cfg': editSetupCfg };
    for (const [path, config] of Object.entries(patches)) {
      const result = await evaluate(`${newFile('forge_plugin.py', MARK_PASSED)}${config}`);
      expect(result, path).toMatchObject({ reward: 0, report: { test_infrastructure_reset: [path] } });
      expect(result.report.FAIL_TO_PASS, path).toMatchObject({ statuses: { [ADD]: 'failed' } });
    }
  }, 180_000);

  it('gives 0 to a sitecustomize.py or usercustomize.py on the test command\'s PYTHONPATH that adds a plugin to PYTEST_ADDOPTS', async () => {
    const command = 'PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} python3 -m pytest -p no:cacheprovider tests';
    for (const path of ['sitecustomize.py', 'usercustomize.py']) {
      const hook = newFile(path, 'import os\nos.environ["PYTEST_ADDOPTS"] = os.environ.get("PYTEST_ADDOPTS", "") + " -p forge_plugin"\n');
      const result = await evaluate(`${newFile('forge_plugin.py', MARK_PASSED)}${hook}`, { test_command: command });
      expect(result, path).toMatchObject({ reward: 0, report: { test_infrastructure_reset: [path] } });
      expect(result.report.FAIL_TO_PASS, path).toMatchObject({ statuses: { [ADD]: 'failed' } });
    }
  }, 120_000);

  it('gives 0 to a *.dist-info whose pytest11 entry point loads a plugin of the patch', async () => {
    const dist = `${newFile('forge_dist-1.0.dist-info/METADATA', 'Metadata-Version: 2.1\nName: forge-dist\nVersion: 1.0\n')}${newFile('forge_dist-1.0.dist-info/entry_points.txt', '[pytest11]\nforge = forge_plugin\n')}`;
    const result = await evaluate(`${newFile('forge_plugin.py', MARK_PASSED)}${dist}`);
    expect(result).toMatchObject({ reward: 0, report: { test_infrastructure_reset: ['forge_dist-1.0.dist-info/METADATA', 'forge_dist-1.0.dist-info/entry_points.txt'] } });
  }, 120_000);

  it('gives 0 to package code that rewrites the report from an atexit hook, after pytest wrote it', async () => {
    const result = await evaluate(appendToCalc(['', '', 'import atexit, json, os', `atexit.register(lambda: ${FORGED_REPORT})`]));
    expect(result).toMatchObject({ reward: 0, report: { resolved: false, test_error: expect.stringContaining('changed after pytest wrote it') } });
  }, 120_000);

  it("gives 0 to package code that takes the plugin's nonce and channel and announces a report of its own after the plugin's", async () => {
    const forged = `{"version": 1, "exitstatus": 0, "tests": {"${ADD}": "passed", "${MUL}": "passed"}, "collect_errors": []}`;
    const result = await evaluate(
      appendToCalc([
        '',
        '',
        'import atexit, hashlib, os, sys',
        '_nonce = sys.modules["rollout_swe_report"]._nonce',
        '_channel = os.dup(3)',
        '',
        '',
        '@atexit.register',
        'def _forge():',
        `    data = ${JSON.stringify(forged)}.encode()`,
        '    open(os.environ["ROLLOUT_SWE_REPORT"], "wb").write(data)',
        '    os.write(_channel, ("ROLLOUT-SWE %s report %s %d\\n" % (_nonce, hashlib.sha256(data).hexdigest(), len(data))).encode())',
      ]),
    );
    expect(result).toMatchObject({ reward: 0, report: { resolved: false, test_error: expect.stringContaining("the plugin's channel carried 2 reports, not one") } });
  }, 120_000);

  it("gives 0, not an ENVIRONMENT_ERROR the trainer drops, to package code that deletes the plugin's started marker", async () => {
    const result = await evaluate(appendToCalc(['', '', 'import atexit, os', 'atexit.register(lambda: os.remove(os.environ["ROLLOUT_SWE_REPORT"] + ".started"))']));
    expect(result).toMatchObject({ reward: 0, report: { applied: true, resolved: false } });
    expect(result.report.FAIL_TO_PASS).toMatchObject({ statuses: { [ADD]: 'failed' } });
  }, 120_000);

  it('gives 0, not an ENVIRONMENT_ERROR the trainer drops, to a patch that keeps pytest from starting (a module at the root shadowing one pytest imports)', async () => {
    // Root modules under the names pytest imports are reset (below); a test command that imports the package first
    // (as many build or check it) is kept from pytest by the package itself.
    const result = await evaluate(appendToCalc(['raise ImportError("not today")']), { test_command: IMPORT_THEN_PYTEST });
    expect(result).toMatchObject({
      reward: 0,
      details: { applied: 1 },
      report: { applied: true, resolved: false, test_error: expect.stringContaining('pytest did not start with the patch applied (it does without it)') },
    });
  }, 120_000);

  it('gives 0 to a fix that hides the PASS_TO_PASS test it broke by making it skip', async () => {
    const skip = ['diff --git a/calc.py b/calc.py', '--- a/calc.py', '+++ b/calc.py', '@@ -1,6 +1,7 @@', ' def add(a, b):', '-    return a - b', '+    return a + b', ' ', ' ', ' def mul(a, b):', '+    import unittest; raise unittest.SkipTest("later")', '     return a * b', ''].join('\n');
    const result = await evaluate(skip);
    expect(result.report.PASS_TO_PASS).toMatchObject({ statuses: { [MUL]: 'skipped' }, passed: 0, failed: 1, fraction: 0 });
    expect(result).toMatchObject({ reward: 0, details: { fail_to_pass: 1, pass_to_pass: 0 } });
  }, 120_000);

  it('gives 0 to a patch that makes an image file a link to the reset\'s own stdin (/proc/self/fd/0), swallowing the names after it', async () => {
    // cmp followed the link and read the list of changed names the reset was working through: the conftest.py after
    // setup.cfg was never seen, so never reset.
    const result = await evaluate(`${deleteFile('setup.cfg')}${newSymlink('setup.cfg', '/proc/self/fd/0')}${newFile('conftest.py', MARK_PASSED)}`);
    expect(result).toMatchObject({ reward: 0, report: { test_infrastructure_reset: ['setup.cfg', 'conftest.py'] } });
    expect(result.report.FAIL_TO_PASS).toMatchObject({ statuses: { [ADD]: 'failed' } });
  }, 120_000);

  it('gives 0, not a hang, to a patch that makes an image file a link to the reset\'s stdout (/proc/self/fd/1)', async () => {
    const result = await evaluate(`${deleteFile('setup.cfg')}${newSymlink('setup.cfg', '/proc/self/fd/1')}${newFile('conftest.py', MARK_PASSED)}`);
    expect(result).toMatchObject({ reward: 0, report: { test_infrastructure_reset: ['setup.cfg', 'conftest.py'] } });
  }, 120_000);

  it('gives 0 to a *.dist-info that is a link to a directory of the patch (its entry point loads a plugin of the patch)', async () => {
    const evil = `${newFile('evil/METADATA', 'Metadata-Version: 2.1\nName: forge-dist\nVersion: 1.0\n')}${newFile('evil/entry_points.txt', '[pytest11]\nforge = forge_plugin\n')}`;
    const result = await evaluate(`${newFile('forge_plugin.py', MARK_PASSED)}${evil}${newSymlink('forge_dist-1.0.dist-info', 'evil')}`);
    expect(result).toMatchObject({ reward: 0, report: { test_infrastructure_reset: ['forge_dist-1.0.dist-info'] } });
    expect(result.report.FAIL_TO_PASS).toMatchObject({ statuses: { [ADD]: 'failed' } });
  }, 120_000);

  it('gives 0 to a rollout_swe_report.py of the patch that shadows the report plugin, takes the nonce and reports every test passed', async () => {
    const forged = `{"version": 1, "exitstatus": 0, "tests": {"${ADD}": "passed", "${MUL}": "passed"}, "collect_errors": []}`;
    const plugin = [
      'import hashlib, os',
      '_nonce = os.read(4, 128).decode().strip()',
      'os.write(3, ("ROLLOUT-SWE %s started %d\\n" % (_nonce, os.getpid())).encode())',
      '',
      '',
      'def pytest_sessionfinish(session, exitstatus):',
      `    data = ${JSON.stringify(forged)}.encode()`,
      '    open(os.environ["ROLLOUT_SWE_REPORT"], "wb").write(data)',
      '    os.write(3, ("ROLLOUT-SWE %s report %s %d\\n" % (_nonce, hashlib.sha256(data).hexdigest(), len(data))).encode())',
    ].join('\n');
    const result = await evaluate(newFile('rollout_swe_report.py', plugin));
    expect(result).toMatchObject({ reward: 0, report: { test_infrastructure_reset: ['rollout_swe_report.py'] } });
    expect(result.report.FAIL_TO_PASS).toMatchObject({ statuses: { [ADD]: 'failed' } });
  }, 120_000);

  // Found by review (helper-50): a module at the root named after a standard-library module pytest imports before any
  // plugin (argparse) ran first, took the nonce from fd 4 and, from an atexit hook, announced a forged report of its own.
  it('gives 0 to a root module of the patch shadowing a standard-library module, which takes the nonce and forges the report at exit', async () => {
    const forged = `{"version": 1, "exitstatus": 0, "tests": {"${ADD}": "passed", "${MUL}": "passed"}, "collect_errors": []}`;
    const shadow = [
      'import atexit, hashlib, importlib.util, os, sys, sysconfig',
      '_nonce = os.read(4, 128).decode().strip()',
      'os.write(3, ("ROLLOUT-SWE %s started %d\\n" % (_nonce, os.getpid())).encode())',
      '',
      '',
      'def _forge():',
      `    data = ${JSON.stringify(forged)}.encode()`,
      '    open(os.environ["ROLLOUT_SWE_REPORT"], "wb").write(data)',
      '    os.write(3, ("ROLLOUT-SWE %s report %s %d\\n" % (_nonce, hashlib.sha256(data).hexdigest(), len(data))).encode())',
      '',
      '',
      'atexit.register(_forge)',
      '_spec = importlib.util.spec_from_file_location("argparse", os.path.join(sysconfig.get_paths()["stdlib"], "argparse.py"))',
      '_real = importlib.util.module_from_spec(_spec)',
      'sys.modules["argparse"] = _real',
      '_spec.loader.exec_module(_real)',
    ].join('\n');
    const result = await evaluate(newFile('argparse.py', shadow));
    expect(result).toMatchObject({ reward: 0, report: { test_infrastructure_reset: ['argparse.py'] } });
    expect(result.report.FAIL_TO_PASS).toMatchObject({ statuses: { [ADD]: 'failed' } });
    // The same under the name of a dependency pytest imports at start-up (iniconfig), as a package.
    const asDependency = await evaluate(newFile('iniconfig/__init__.py', shadow.replaceAll('argparse', 'iniconfig').replace('os.path.join(sysconfig.get_paths()["stdlib"], "iniconfig.py")', 'os.path.join(sysconfig.get_paths()["purelib"], "iniconfig", "__init__.py")')));
    expect(asDependency).toMatchObject({ reward: 0, report: { test_infrastructure_reset: ['iniconfig/__init__.py'] } });
  }, 120_000);

  it("still rewards an honest fix that only patch(1) applies (a context line off: git apply refuses, --fuzz=5 does not), the copy's .git put back after it", async () => {
    const fuzzy = ['diff --git a/calc.py b/calc.py', '--- a/calc.py', '+++ b/calc.py', '@@ -1,4 +1,4 @@', ' def add(x, y):', '-    return a - b', '+    return a + b', ' ', ' ', ''].join('\n');
    const result = await evaluate(fuzzy);
    expect(result).toMatchObject({ reward: 1, details: { applied: 1 }, report: { resolved: true, test_infrastructure_reset: [] } });
  }, 120_000);

  it('gives 0 to a patch that git apply refuses for writing into .git, not applied by patch(1) either (a .git/commondir hid every change from the reset)', async () => {
    const result = await evaluate(`${newFile('.git/commondir', '/nowhere')}${newFile('conftest.py', MARK_PASSED)}`);
    expect(result).toMatchObject({ reward: 0, details: { applied: 0 }, report: { applied: false, apply_error: expect.stringContaining('.git') } });
  }, 120_000);

  it('gives 0, not an ENVIRONMENT_ERROR, to a patch that makes the directory of a listed test a dangling link (the reset cannot put the test back through it)', async () => {
    const emptied = (['tests/__init__.py', 'tests/test_calc.py', 'tests/helpers.py', 'tests/test_sum.py'] as const).map(deleteFile).join('');
    const result = await evaluate(`${emptied}${newSymlink('tests', '/nonexistent')}${newFile('conftest.py', MARK_PASSED)}`);
    expect(result).toMatchObject({ reward: 0, report: { test_infrastructure_reset: expect.arrayContaining(['tests/test_calc.py', 'conftest.py']) } });
    expect(result.report.FAIL_TO_PASS).toMatchObject({ statuses: { [ADD]: 'failed' } });
  }, 120_000);

  it('gives 0 to a conftest.py in a directory whose name has a newline, a leading dash, a space, a glob and a non-UTF-8 byte (registers its hooks for every test)', async () => {
    const global = ['import pytest', '', '', 'class _Forge:', ...MARK_PASSED.split('\n').slice(3).map((l) => (l === '' ? l : `    ${l.replace('(item', '(self, item')}`)), '', 'def pytest_configure(config):', '    config.pluginmanager.register(_Forge())', ''].join('\n');
    const quoted = 'tests/-a b*\\n\\377/conftest.py';
    const lines = global.replace(/\n$/, '').split('\n');
    const patch = [`diff --git "a/${quoted}" "b/${quoted}"`, 'new file mode 100644', '--- /dev/null', `+++ "b/${quoted}"`, `@@ -0,0 +1,${lines.length} @@`, ...lines.map((l) => `+${l}`), ''].join('\n');
    const result = await evaluate(patch);
    expect(result).toMatchObject({ reward: 0, report: { test_infrastructure_reset: ['tests/-a b*\n\ufffd/conftest.py'] } });
    expect(result.report.FAIL_TO_PASS).toMatchObject({ statuses: { [ADD]: 'failed' } });
  }, 120_000);

  it("resets 20,000 conftest.py files of a patch within the sandbox's command time (one rm each outlasted it: an ENVIRONMENT_ERROR), naming the first 100", async () => {
    const patch = Array.from({ length: 20_000 }, (_, i) => newFile(`d${i}/conftest.py`, 'x = 1\n')).join('');
    const result = await evaluate(patch);
    expect(result).toMatchObject({ reward: 0, report: { test_infrastructure_reset_count: 20_000 } });
    expect(result.report.test_infrastructure_reset).toHaveLength(100);
  }, 180_000);

  it('gives 0, not an ENVIRONMENT_ERROR the trainer drops, to a patch whose module at the root keeps pytest from starting until the test budget runs out', async () => {
    const result = await evaluate(appendToCalc(['import time', 'time.sleep(3600)']), { test_command: IMPORT_THEN_PYTEST }, 5_000);
    expect(result).toMatchObject({
      reward: 0,
      details: { applied: 1 },
      report: { applied: true, resolved: false, test_error: expect.stringContaining('pytest did not start within 5000 ms with the patch applied (it does without it)') },
    });
  }, 120_000);

  it("gives 0 to a patch that ships pytest's cached bytecode of a listed test file, rewritten to pass (the test file itself untouched)", async () => {
    // pytest's assertion rewriter reads tests/__pycache__/test_calc.<tag>-pytest-<version>.pyc when its recorded mtime
    // and size are the source's (PYTHONDONTWRITEBYTECODE stops writing, not reading); the copy keeps the image's mtimes,
    // which the agent can read. The bytecode here is made by pytest itself, in the image, from a test of the same size.
    const mtime = Math.floor(statSync(join(fx.repo, 'tests/test_calc.py')).mtimeMs / 1000);
    const sandbox = await fx.start();
    const make = await sandbox.exec(['bash', '-c', [
      'set -e; cp -R /testbed /work/x; cd /work/x; git init -q .; git add -A; git -c user.name=a -c user.email=a@b commit -qm base',
      "sed -i 's/assert add(2, 2) == 4/assert add(2, 2) != 5/' tests/test_calc.py; touch -d @$1 tests/test_calc.py",
      'env -u PYTHONDONTWRITEBYTECODE python3 -m pytest -q -p no:cacheprovider tests >&2 || true',
      'git checkout -q -- tests/test_calc.py; git add -f tests/__pycache__/test_calc.*pytest*.pyc; git diff --cached --binary',
    ].join('\n'), 'forge', String(mtime)]);
    expect(make.stdout, make.stderr).toContain('GIT binary patch');
    const result = await evaluate(make.stdout);
    expect(result).toMatchObject({ reward: 0, report: { test_infrastructure_reset: [expect.stringMatching(/^tests\/__pycache__\/test_calc\..*pytest.*\.pyc$/)] } });
    expect(result.report.FAIL_TO_PASS).toMatchObject({ statuses: { [ADD]: 'failed' } });
  }, 120_000);

  // The residual, measured so that it is known, not assumed: the package under test is imported into pytest's own
  // interpreter, where it can rewrite pytest (or the plugin) before the tests run. Nothing in that process can stop it;
  // see docs/environments/swe.md "The residual". Should this ever give 0, the hole was closed: flip the expectation.
  it('still cannot stop package code that monkeypatches pytest in the same interpreter (the documented residual)', async () => {
    const patchPytest = ['', '', 'import _pytest.reports', '_init = _pytest.reports.TestReport.__init__', '', '', 'def _forged(self, *args, **kwargs):', '    _init(self, *args, **kwargs)', '    self.outcome = "passed"', '', '', '_pytest.reports.TestReport.__init__ = _forged'];
    const result = await evaluate(appendToCalc(patchPytest));
    expect(result).toMatchObject({ reward: 1, report: { test_infrastructure_reset: [] } });
  }, 120_000);
});
