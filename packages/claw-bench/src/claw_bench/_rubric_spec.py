"""A rubric chain as a task declares it: criteria (id, text, requires, weight, scale) checked and
put in dependency order, and a claw task's ``rubric.json`` read into the ``judge`` entry of its
meta. Judging the chain is :mod:`claw_bench.loaders.rubric`; this module needs nothing of the
loaders, so loading a task does not import them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import attrs

from claw_bench.errors import JudgeError

SCALES = ("binary", "graded")
CRITERION_KEYS = ("id", "text", "requires", "weight", "scale")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class RubricError(JudgeError):
    """A rubric chain is malformed, or a criterion got no usable answer (``verdicts`` so far)."""

    def __init__(self, message: str, verdicts: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.verdicts = verdicts or []


@attrs.frozen(kw_only=True)
class Criterion:
    """One criterion of a chain."""

    id: str
    text: str
    requires: tuple[str, ...] = ()
    weight: float = 1.0
    scale: str = "binary"

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "text": self.text,
            "requires": list(self.requires),
            "weight": self.weight,
            "scale": self.scale,
        }


def _criterion(item: Any, where: str) -> Criterion:
    if not isinstance(item, dict):
        raise RubricError(f"{where}: expected an object {{id, text, requires, weight, scale}}")
    unknown = sorted(set(item) - set(CRITERION_KEYS))
    if unknown:
        raise RubricError(f"{where}: unknown field(s) {unknown}; allowed: {list(CRITERION_KEYS)}")
    cid, text = item.get("id"), item.get("text")
    if not isinstance(cid, str) or not _ID.match(cid):
        raise RubricError(f"{where}.id: must match {_ID.pattern}, got {cid!r}")
    if not isinstance(text, str) or not text.strip():
        raise RubricError(f"{where}.text: must be a non-empty string")
    requires = item.get("requires", [])
    if not isinstance(requires, list) or not all(isinstance(r, str) for r in requires):
        raise RubricError(f"{where}.requires: must be a list of criterion ids, got {requires!r}")
    weight = item.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
        raise RubricError(f"{where}.weight: must be a positive number, got {weight!r}")
    scale = item.get("scale", "binary")
    if scale not in SCALES:
        raise RubricError(f"{where}.scale: must be one of {SCALES}, got {scale!r}")
    return Criterion(
        id=cid, text=text.strip(), requires=tuple(requires), weight=float(weight), scale=scale
    )


def parse_criteria(items: Any, where: str) -> list[Criterion]:
    """Validated criteria, in an order where each comes after those it requires (else in the
    order given); RubricError names ``where``, the criterion's index and the field."""
    if not isinstance(items, list) or not items:
        raise RubricError(f"{where}: field 'criteria' must be a non-empty list")
    crits = [_criterion(c, f"{where}: criteria[{i}]") for i, c in enumerate(items)]
    by_id: dict[str, Criterion] = {}
    for i, c in enumerate(crits):
        if c.id in by_id:
            raise RubricError(f"{where}: criteria[{i}].id {c.id!r} repeats")
        by_id[c.id] = c
    for i, c in enumerate(crits):
        for r in c.requires:
            if r not in by_id or r == c.id:
                raise RubricError(
                    f"{where}: criteria[{i}].requires: {r!r} is not another criterion's id"
                )
            if by_id[r].scale != "binary":
                raise RubricError(
                    f"{where}: criteria[{i}].requires: {r!r} is graded; only binary "
                    "criteria can be required"
                )
    ordered: list[Criterion] = []
    done: set[str] = set()
    while len(ordered) < len(crits):
        ready = [c for c in crits if c.id not in done and set(c.requires) <= done]
        if not ready:
            cycle = sorted(c.id for c in crits if c.id not in done)
            raise RubricError(f"{where}: criteria requirements form a cycle among {cycle}")
        ordered.append(ready[0])
        done.add(ready[0].id)
    return ordered


RUBRIC_FILE = "rubric.json"
RUBRIC_KEYS = ("criteria", "evidence", "automated_weight")


def load_rubric_file(path: Path, instruction: str) -> dict[str, Any]:
    """A claw task's ``rubric.json`` as the ``judge`` entry of its meta; RubricError names the file
    and field. Keys: ``criteria`` (the chain), ``evidence`` (workspace globs the judge sees,
    collected with the run; default ``["**"]``), ``automated_weight`` (the verifier's share of
    the reward, in [0, 1]; default 0: the chain alone)."""
    where = str(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RubricError(f"{where}: not a readable JSON file: {exc}") from exc
    if not isinstance(data, dict):
        raise RubricError(f"{where}: expected a JSON object with {list(RUBRIC_KEYS)}")
    unknown = sorted(set(data) - set(RUBRIC_KEYS))
    if unknown:
        raise RubricError(f"{where}: unknown field(s) {unknown}; allowed: {list(RUBRIC_KEYS)}")
    criteria = [c.to_dict() for c in parse_criteria(data.get("criteria"), where)]
    evidence = data.get("evidence", ["**"])
    if (
        not isinstance(evidence, list)
        or not evidence
        or not all(isinstance(g, str) and g and not g.startswith("/") for g in evidence)
    ):
        raise RubricError(
            f"{where}: field 'evidence' must be a non-empty list of workspace globs, got {evidence!r}"
        )
    w = data.get("automated_weight", 0.0)
    if isinstance(w, bool) or not isinstance(w, int | float) or not 0 <= w <= 1:
        raise RubricError(
            f"{where}: field 'automated_weight' must be a number in [0, 1], got {w!r}"
        )
    return {
        "rubric": "\n".join(f"- [{c['id']}] {c['text']}" for c in criteria),
        "instruction": instruction,
        "grading": "rubric_chain",
        "weights": {"automated": float(w), "llm_judge": 1.0 - float(w)},
        "criteria": criteria,
        "evidence": list(evidence),
    }
