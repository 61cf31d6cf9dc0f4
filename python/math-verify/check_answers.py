"""Answer equivalence by math-verify, one JSON object per line in and out.

Run by the math environment's `math-verify` checker inside the sample's sandbox (no network, the sandbox's memory
and time limits), with the pinned packages of python/math-verify/requirements.txt bound read-only:

    python3 -I -S check_answers.py SITE_PACKAGES < pairs.jsonl > verdicts.jsonl

Input lines: {"gold": "<reference answer>", "pred": "<model's final answer>"}, optionally "raw": true to pass both
texts as they are, both parsed with LaTeX (\\boxed first) + plain-expression extraction, as math-verify's own tests do.
Output lines, in the same order: {"equivalent": bool, "gold": [parsed forms], "pred": [parsed forms]}; a line
that is not such an object gets {"error": "..."} instead, and the others go on. A prediction whose check finds no
verdict within PRED_BOUND_S (or whose check process dies) is not equivalent, with "limit" saying why.

How the answers are read is what verl's math-verify reward does: each answer is put in \\boxed{} (unless it
already holds one) and parsed with LaTeX extraction for the gold and LaTeX + plain-expression extraction for the
prediction; then verify(gold, pred). math-verify's own timeouts (signal.alarm, so this runs single-threaded) make
a pathological answer "not equivalent" instead of a hang, but an alarm only fires between bytecodes: one long C
computation of sympy's (an answer such as "9!!!! + 9!!!!") runs on past it. So the gold is parsed here and the
prediction's parse and verify run in a forked child, killed at PRED_BOUND_S: what the answer did is its verdict (not
equivalent), never a checker that overran the caller's timeout, which the caller must read as an infrastructure failure.
"""

import json
import os
import select
import signal
import sys
import time

if len(sys.argv) != 2:
    sys.exit("usage: check_answers.py SITE_PACKAGES")
# -I -S leave out the user's and the system's site-packages and the current directory: only these packages count.
sys.path.insert(0, sys.argv[1])

import logging  # noqa: E402

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify  # noqa: E402

# math-verify logs a warning on every timeout; the verdict already says "not equivalent".
logging.disable(logging.CRITICAL)

PARSE_TIMEOUT_S = 5
VERIFY_TIMEOUT_S = 5
GOLD_CONFIG = [LatexExtractionConfig()]
PRED_CONFIG = [LatexExtractionConfig(), ExprExtractionConfig()]
RAW_CONFIG = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
# An honest prediction's parse and verify end within math-verify's two timeouts; the rest is slack for a loaded machine.
PRED_BOUND_S = PARSE_TIMEOUT_S + VERIFY_TIMEOUT_S + 5


def boxed(answer: str) -> str:
    return answer if "\\boxed" in answer else "\\boxed{" + answer + "}"


def check(line: str) -> dict:
    try:
        item = json.loads(line)
    except ValueError as err:
        return {"error": f"not JSON: {err}"}
    if not isinstance(item, dict) or not isinstance(item.get("gold"), str) or not isinstance(item.get("pred"), str):
        return {"error": 'expected {"gold": string, "pred": string}'}
    if item.get("raw") is True:
        gold = parse(item["gold"], extraction_config=RAW_CONFIG, parsing_timeout=PARSE_TIMEOUT_S)
        pred_text, pred_config = item["pred"], RAW_CONFIG
    else:
        gold = parse(boxed(item["gold"]), extraction_config=GOLD_CONFIG, parsing_timeout=PARSE_TIMEOUT_S)
        pred_text, pred_config = boxed(item["pred"]), PRED_CONFIG
    gold_forms = [safe_str(x) for x in gold]

    def judge_pred():
        pred = parse(pred_text, extraction_config=pred_config, parsing_timeout=PARSE_TIMEOUT_S)
        equivalent = verify(gold, pred, timeout_seconds=VERIFY_TIMEOUT_S)
        return {"equivalent": bool(equivalent), "pred": [safe_str(x) for x in pred]}

    verdict = bounded(judge_pred, PRED_BOUND_S)
    return {"equivalent": False, "gold": gold_forms, "pred": [], **verdict} if "limit" in verdict else {"gold": gold_forms, **verdict}


def bounded(work, seconds):
    """work() run in a forked child, its JSON result read back; {"limit": why} when the child overran or died."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            data = json.dumps(work()).encode()
        except BaseException as err:  # noqa: BLE001 (reported as the parent reports any exception of check)
            data = json.dumps({"raised": f"{type(err).__name__}: {err}"[:500]}).encode()
        while data:
            data = data[os.write(write_end, data):]
        os._exit(0)
    os.close(write_end)
    chunks, deadline = [], time.monotonic() + seconds
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_end], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return {"limit": f"no verdict within {seconds} s"}
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
    _, status = os.waitpid(pid, 0)
    try:
        result = json.loads(b"".join(chunks))
    except ValueError:
        return {"limit": f"the check ended without a verdict (exit status {os.waitstatus_to_exitcode(status)})"}
    if "raised" in result:
        raise RuntimeError(result["raised"])
    return result


def safe_str(value) -> str:
    try:
        return str(value)[:200]
    except Exception:  # a sympy object whose printing fails must not cost the verdict
        return "?"


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            result = check(line)
        except Exception as err:  # one bad pair must not end the batch
            result = {"error": f"{type(err).__name__}: {err}"[:500]}
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
