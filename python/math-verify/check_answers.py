"""Answer equivalence by math-verify, one JSON object per line in and out.

Run by the math environment's `math-verify` checker inside the sample's sandbox (no network, the sandbox's memory
and time limits), with the pinned packages of python/math-verify/requirements.txt bound read-only:

    python3 -I -S check_answers.py SITE_PACKAGES < pairs.jsonl > verdicts.jsonl

Input lines: {"gold": "<reference answer>", "pred": "<model's final answer>"}, optionally "raw": true to pass both
texts as they are, both parsed with LaTeX (\\boxed first) + plain-expression extraction, as math-verify's own tests do.
Output lines, in the same order: {"equivalent": bool, "gold": [parsed forms], "pred": [parsed forms]}; a line
that is not such an object gets {"error": "..."} instead, and the others go on.

How the answers are read is what verl's math-verify reward does: each answer is put in \\boxed{} (unless it
already holds one) and parsed with LaTeX extraction for the gold and LaTeX + plain-expression extraction for the
prediction; then verify(gold, pred). math-verify's own timeouts (signal.alarm, so this runs single-threaded) make
a pathological answer "not equivalent" instead of a hang.
"""

import json
import sys

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
        pred = parse(item["pred"], extraction_config=RAW_CONFIG, parsing_timeout=PARSE_TIMEOUT_S)
    else:
        gold = parse(boxed(item["gold"]), extraction_config=GOLD_CONFIG, parsing_timeout=PARSE_TIMEOUT_S)
        pred = parse(boxed(item["pred"]), extraction_config=PRED_CONFIG, parsing_timeout=PARSE_TIMEOUT_S)
    equivalent = verify(gold, pred, timeout_seconds=VERIFY_TIMEOUT_S)
    return {"equivalent": bool(equivalent), "gold": [safe_str(x) for x in gold], "pred": [safe_str(x) for x in pred]}


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
