"""OfficeQA (github.com/databricks/officeqa) as published: its questions CSV as claw tasks.

The CSV (``officeqa.csv``: ``uid, question, answer, source_docs, source_files, difficulty``;
``source_files`` one bulletin file name per line) is a suite: ``claw-bench plan -s officeqa.csv``.
The corpus is the folder of parsed bulletins (``treasury_bulletin_YYYY_MM.txt``), by default
``corpus/`` next to the CSV (``CLAW_BENCH_OFFICEQA_CORPUS`` names another). What a task sees of it
(``CLAW_BENCH_OFFICEQA_SCOPE``):

- ``source_files`` (default): copies of the question's own bulletins in the workspace's
  ``corpus/`` folder (the host's corpus is never written);
- ``corpus``: the whole corpus at its absolute host path, which the instruction names; run the
  jobs with ``--sandbox-arg=--ro-path=CORPUS`` so that bwrap shows it there read-only.

The answer is the agent's final message as OfficeQA takes it: the text of the last
``<FINAL_ANSWER>...</FINAL_ANSWER>``, else the whole message. The final message is the
``answer.txt`` the harness wrote (claw-agent) when the run collected one, else the harness's
stdout (Claude Code, Codex print it). ``claw-bench score`` scores it with
:func:`score_answer`, OfficeQA's ``reward.py`` rules (``CLAW_BENCH_OFFICEQA_TOLERANCE``: its
relative tolerance, default 0); the verify step only notes that the workspace was kept.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

from claw_bench.errors import TaskError
from claw_bench.loaders._common import LoadOptions
from claw_bench.loaders._officeqa_score import final_answer, score_answer
from claw_bench.tasks import TASK_ID, Script, Task

COLUMNS = ("uid", "question", "answer", "source_files")
SCOPES = ("source_files", "corpus")
ANSWER_FILE = "answer.txt"
WORKSPACE_CORPUS = "corpus"
_VERIFY = (
    "# OfficeQA is scored from the agent's final message by `claw-bench score`\n"
    "# (claw_bench.loaders.officeqa); this step only records that the job ended.\n"
    "print('officeqa: answer scored by claw-bench score')\n"
)


def is_officeqa_csv(path: Path) -> bool:
    """A ``.csv`` file whose header has OfficeQA's question columns."""
    if path.suffix != ".csv" or not path.is_file():
        return False
    with path.open(encoding="utf-8", errors="replace", newline="") as fh:
        header = next(csv.reader(fh), [])
    return all(c in header for c in COLUMNS)


def _env_settings(csv_path: Path) -> tuple[Path, str, float]:
    corpus = Path(os.environ.get("CLAW_BENCH_OFFICEQA_CORPUS") or csv_path.parent / "corpus")
    scope = os.environ.get("CLAW_BENCH_OFFICEQA_SCOPE") or "source_files"
    if scope not in SCOPES:
        raise TaskError(f"CLAW_BENCH_OFFICEQA_SCOPE={scope!r}: expected one of {list(SCOPES)}")
    raw = os.environ.get("CLAW_BENCH_OFFICEQA_TOLERANCE") or "0"
    try:
        tolerance = float(raw)
    except ValueError:
        tolerance = -1.0
    if not 0 <= tolerance <= 1:
        raise TaskError(f"CLAW_BENCH_OFFICEQA_TOLERANCE={raw!r}: expected a number in [0, 1]")
    return corpus, scope, tolerance


def load_officeqa_csv(
    path: str | Path,
    opts: LoadOptions | None = None,
    *,
    corpus: str | Path | None = None,
    scope: str | None = None,
    tolerance: float | None = None,
) -> list[Task]:
    """One task per row of an OfficeQA questions CSV; arguments left None come from the
    ``CLAW_BENCH_OFFICEQA_*`` variables (module docstring). TaskError names the row and field."""
    path = Path(path)
    env_corpus, env_scope, env_tol = _env_settings(path)
    root = Path(corpus) if corpus is not None else env_corpus
    scope = scope or env_scope
    tol = env_tol if tolerance is None else tolerance
    if scope not in SCOPES or not 0 <= tol <= 1:
        raise TaskError(f"{path}: scope must be one of {list(SCOPES)}, tolerance in [0, 1]")
    if not root.is_dir():
        raise TaskError(f"{path}: OfficeQA corpus folder {root} does not exist")
    try:
        with path.open(encoding="utf-8", newline="") as fh:
            rows = list(csv.DictReader(fh))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise TaskError(f"{path}: not a readable CSV: {exc}") from exc
    threshold = (opts or LoadOptions()).pass_threshold
    return [_task(path, i + 2, row, root, scope, tol, threshold) for i, row in enumerate(rows)]


def _field(row: dict[str, Any], key: str, where: str) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not value.strip():
        raise TaskError(f"{where}: field {key!r} is missing or empty")
    return value


def _task(
    csv_path: Path, line: int, row: dict[str, Any], root: Path, scope: str, tol: float, thr: float
) -> Task:
    where = f"{csv_path}:{line}"
    uid, question, answer = (_field(row, k, where) for k in ("uid", "question", "answer"))
    if not TASK_ID.match(uid):
        raise TaskError(f"{where}: uid {uid!r} is not a valid task id")
    sources = [s.strip() for s in _field(row, "source_files", where).splitlines() if s.strip()]
    workspace: dict[str, str | bytes] = {}
    if scope == "source_files":
        for name in sources:
            file = root / name
            if not file.is_file() or Path(name).name != name:
                raise TaskError(f"{where}: source file {name!r} is not in the corpus {root}")
            workspace[f"{WORKSPACE_CORPUS}/{name}"] = file.read_bytes()
        where_text = (
            f"The U.S. Treasury Bulletins for this question are in the folder "
            f"{WORKSPACE_CORPUS}/ of your working directory: {', '.join(sources)}."
        )
    else:
        where_text = (
            f"The U.S. Treasury Bulletins (parsed text, one file per issue, named "
            f"treasury_bulletin_YYYY_MM.txt) are in the read-only folder {root.resolve()}."
        )
    instruction = (
        f"{question.strip()}\n\n{where_text}\n\n"
        "End your final message with the answer alone between tags, e.g. "
        "<FINAL_ANSWER>1,234</FINAL_ANSWER>."
    )
    difficulty = (row.get("difficulty") or "").strip().lower() or None
    return Task(
        id=uid,
        instruction=instruction,
        difficulty=difficulty if difficulty in ("easy", "medium", "hard") else None,
        tags=("officeqa",),
        workspace=workspace,
        verify=Script(name="verify.py", text=_VERIFY, interpreter="python3"),
        pass_threshold=thr,
        source="officeqa",
        path=where,
        meta={
            "officeqa": {"answer": answer, "tolerance": tol, "source_files": sources},
            "collect": [ANSWER_FILE],
        },
    )


def final_message(run: dict[str, Any]) -> str:
    """The run's final agent message: its collected ``answer.txt``, else its stdout."""
    collected = run.get("collected") or {}
    text = collected.get(ANSWER_FILE) if isinstance(collected, dict) else None
    if isinstance(text, str) and text.strip():
        return text
    out = run.get("stdout_tail")
    return out if isinstance(out, str) else ""


def apply_officeqa(
    out: dict[str, Any], run: dict[str, Any], spec: dict[str, Any], threshold: float | None = None
) -> dict[str, Any]:
    """Score a verified run's final message against ``spec["answer"]`` (claw.outcome/v1 dict):
    reward = score_answer, passed = reward >= ``threshold`` (else the run's pass threshold, else 1)."""
    message = final_message(run)
    tol = spec.get("tolerance", 0.0)
    reward = score_answer(str(spec.get("answer", "")), message, float(tol))
    thr = threshold if threshold is not None else (run.get("meta") or {}).get("pass_threshold", 1.0)
    out["reward"] = reward
    out["passed"] = reward >= thr
    details = out.setdefault("details", {})
    details.update(
        grading="officeqa", officeqa_answer=final_answer(message)[-500:], officeqa_tolerance=tol
    )
    return out
