"""OfficeQA scoring parity: claw-bench's scorer against the real ``reward.py``, question by
question, over the perturbed answers of packages/claw-bench/tests/_officeqa_cases.py.

Neither reward.py nor the questions CSV is in this repository; take them from a checkout of
github.com/databricks/officeqa (``officeqa.csv`` is in its history, e.g. commit 28b583a, with 246
questions; ``reward.py`` at its head)::

    python bench/officeqa_parity.py --reward officeqa/reward.py --csv officeqa/officeqa.csv

prints the agreement count and every disagreement, and exits 1 on any. With ``--write-expected
FILE`` it also writes the reference scores as JSON lines (how the frozen table of the tests'
fixture questions, tests/data/officeqa/expected_scores.jsonl, was made).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "packages" / "claw-bench" / "tests"))

from _officeqa_cases import cases  # noqa: E402
from claw_bench.loaders._officeqa_score import score_answer  # noqa: E402


def _reference(path: Path):
    spec = importlib.util.spec_from_file_location("officeqa_reward", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{path}: not a Python file")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.score_answer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reward", type=Path, required=True, help="OfficeQA's reward.py")
    ap.add_argument("--csv", type=Path, required=True, help="questions CSV (uid, answer columns)")
    ap.add_argument("--write-expected", type=Path, help="write the reference scores as JSONL")
    args = ap.parse_args(argv)
    reference = _reference(args.reward)
    with args.csv.open(encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    same, differ, lines = 0, [], []
    for row in rows:
        for name, predicted, tol in cases(row["answer"]):
            want = reference(row["answer"], predicted, tol)
            got = score_answer(row["answer"], predicted, tol)
            lines.append(
                {
                    "uid": row["uid"],
                    "case": name,
                    "predicted": predicted,
                    "tolerance": tol,
                    "score": want,
                }
            )
            if got == want:
                same += 1
            else:
                differ.append((row["uid"], row["answer"], name, predicted, tol, want, got))
    for d in differ:
        uid, truth, name, predicted, tol, want, got = d
        print(f"DIFFER {uid} truth={truth!r} {name} {predicted!r} tol={tol}: {want} vs ours {got}")
    n_pass = sum(1 for x in lines if x["score"] == 1.0)
    print(
        f"{len(rows)} questions x {len(lines) // max(len(rows), 1)} cases = {len(lines)}: "
        f"{same} agree, {len(differ)} differ ({n_pass} scored 1 by reward.py)"
    )
    if args.write_expected:
        with args.write_expected.open("w", encoding="utf-8") as out:
            out.writelines(json.dumps(x) + "\n" for x in lines)
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
