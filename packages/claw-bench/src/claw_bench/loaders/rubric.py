"""Rubric chains: a task graded criterion by criterion, each criterion one question to a judge model.

A chain is a list of criteria ``{id, text, requires: [ids], weight, scale}``. ``scale`` is
``binary`` (the default, as JobBench grades: the judge answers YES or NO) or ``graded`` (a score
in [0, 1], as PinchBench's per-criterion rubrics are scored). A criterion may require others
(only binary ones); it is asked only when every criterion it requires passed, else it is not
asked, counts as failed and its verdict says ``skipped: requires X``.

The reward rule: the weighted fraction passed, ``sum(w_i * s_i) / sum(w_i)`` over *all* criteria,
where ``s_i`` is 1 for a YES, 0 for a NO or a skipped criterion, and the score of a graded one.
Skipped criteria stay in the denominator: a chain whose base step failed must not score higher
than one whose later steps were tried and failed. Weights default to 1, so an unweighted chain
scores the fraction of its criteria that passed (JobBench's per-task score). A task may blend
the chain with its verifier's reward (``weights``: automated / llm_judge, as for the holistic
judge); ``passed`` is ``reward >= threshold`` when one applies, else every criterion passed.

Each criterion is one request to an OpenAI- or Anthropic-compatible endpoint (claw-proxy's
passthrough or a policy, or any provider; :class:`claw_bench.loaders.judge.Judge`) over the
evidence: the task, the final workspace files and the agent's final message (the run's stdout
tail). Its answer is parsed strictly: ``YES`` / ``NO``, or one JSON object ``{"verdict": "YES" |
"NO"}`` (binary) or ``{"score": x}`` (graded). Network errors, HTTP 5xx / 429 and unparsable
answers are asked again (``Judge.retries``); when the tries run out the outcome is
``infra_error``, never a failed criterion. Parsed answers are cached by sha256(criterion,
evidence digest, judge model) (``Judge.cache``), so scoring again asks nothing twice.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path
from typing import Any

import attrs

from claw_bench.loaders._judge_cache import cache_key
from claw_bench.loaders.judge import (
    Judge,
    JudgeAnswer,
    JudgeError,
    finish_judged,
    judge_prompt,
    no_judge,
    workspace_files,
)

SCALES = ("binary", "graded")
CRITERION_KEYS = ("id", "text", "requires", "weight", "scale")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
FINAL_MESSAGE_CHARS = 4000
SYSTEMS = {
    "binary": (
        "You are a strict, fair grader of an AI agent's work. You are given the task the agent "
        "was asked to do, the files of its final workspace, its final message and ONE criterion. "
        "Decide whether the work meets that criterion; judge only what the evidence shows. "
        'Answer with one JSON object and nothing else: {"verdict": "YES" or "NO", '
        '"reason": "<one sentence>"}.'
    ),
    "graded": (
        "You are a strict, fair grader of an AI agent's work. You are given the task the agent "
        "was asked to do, the files of its final workspace, its final message and ONE criterion "
        "with its score levels. Score the work on that criterion alone; judge only what the "
        'evidence shows. Answer with one JSON object and nothing else: {"score": <number from 0 '
        'to 1>, "reason": "<one sentence>"}.'
    ),
}


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


def parse_verdict(text: str, scale: str) -> tuple[float, str]:
    """(score, reason) of a strict answer: YES / NO or a JSON object with ``verdict`` (binary),
    one JSON object with ``score`` in [0, 1] or a bare number (graded); JudgeError
    (retryable) otherwise."""
    body = re.sub(r"^```(?:json)?\s*|\s*```$", "", text.strip()).strip()
    bare = body.rstrip(".").strip().upper()
    if scale == "binary" and bare in ("YES", "NO"):
        return (1.0 if bare == "YES" else 0.0), ""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        obj = None
    reason = str(obj.get("reason") or "") if isinstance(obj, dict) else ""
    if scale == "binary" and isinstance(obj, dict):
        said = str(obj.get("verdict", "")).strip().upper()
        if said in ("YES", "NO"):
            return (1.0 if said == "YES" else 0.0), reason
    if scale == "graded":
        v = obj.get("score") if isinstance(obj, dict) else obj
        if isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= 1:
            return float(v), reason
    want = 'YES, NO or {"verdict": "YES" | "NO"}' if scale == "binary" else '{"score": 0..1}'
    raise JudgeError(f"unparsable judge answer (want {want}): {text[:200]!r}", retryable=True)


def evidence_text(instruction: str, files: dict[str, str], final_message: str) -> str:
    """Everything the judge sees besides the criterion: the task, the files, the final message."""
    listing = judge_prompt(instruction, "(asked below, one criterion at a time)", files)
    listing = listing.rsplit("\n\nGrade the work against the rubric.", 1)[0]
    msg = final_message[-FINAL_MESSAGE_CHARS:].strip() or "(no final message)"
    return f"{listing}\n\n# The agent's final message\n\n{msg}"


def _ask(judge: Judge, crit: Criterion, evidence: str) -> tuple[JudgeAnswer, float, str]:
    """One criterion asked until it parses: retried on retryable errors, then RubricError."""
    prompt = (
        f"{evidence}\n\n# Criterion {crit.id}\n\n{crit.text}\n\n"
        "Judge this one criterion. Reply with the JSON object."
    )
    last: JudgeError | None = None
    for attempt in range(judge.retries + 1):
        if attempt and judge.backoff_s:
            time.sleep(judge.backoff_s * 2 ** (attempt - 1))
        try:
            answer = judge.call(prompt, SYSTEMS[crit.scale])
            score, reason = parse_verdict(answer.text, crit.scale)
            return answer, score, reason
        except JudgeError as exc:
            if not exc.retryable:
                raise RubricError(f"criterion {crit.id}: {exc}") from exc
            last = exc
    raise RubricError(f"criterion {crit.id}: no usable answer in {judge.retries + 1} tries: {last}")


def _verdict(crit: Criterion, score: float, reason: str, call_id: Any, cached: bool) -> dict:
    verdict = ("pass" if score >= 1.0 else "fail") if crit.scale == "binary" else "scored"
    return {
        "id": crit.id,
        "verdict": verdict,
        "score": score,
        "weight": crit.weight,
        "reason": reason[:500],
        "call_id": call_id,
        "cached": cached,
    }


def judge_chain(judge: Judge, criteria: list[Criterion], evidence: str) -> list[dict[str, Any]]:
    """Every criterion's verdict, in chain order: asked (or read from the cache) when all it
    requires passed, else ``skipped``; RubricError carrying the verdicts so far when one gets
    no usable answer."""
    digest = hashlib.sha256(evidence.encode("utf-8")).hexdigest()
    verdicts: list[dict[str, Any]] = []
    passed: set[str] = set()
    for c in criteria:
        missing = [r for r in c.requires if r not in passed]
        if missing:
            verdicts.append(
                {
                    "id": c.id,
                    "verdict": "skipped",
                    "score": 0.0,
                    "weight": c.weight,
                    "reason": f"skipped: requires {', '.join(missing)}",
                    "call_id": None,
                    "cached": False,
                }
            )
            continue
        key = cache_key(text=c.text, scale=c.scale, evidence_digest=digest, model=judge.model)
        hit = judge.cache.get(key) if judge.cache is not None else None
        if hit is not None:
            v = _verdict(c, float(hit["score"]), str(hit.get("reason") or ""), hit["call_id"], True)
        else:
            try:
                answer, score, reason = _ask(judge, c, evidence)
            except RubricError as exc:
                raise RubricError(str(exc), verdicts) from exc
            v = _verdict(c, score, reason, answer.call_id, False)
            if judge.cache is not None:
                judge.cache.put(
                    {"key": key, "criterion": c.id, "model": judge.model}
                    | {k: v[k] for k in ("verdict", "score", "reason", "call_id")}
                )
        if v["verdict"] == "pass":
            passed.add(c.id)
        verdicts.append(v)
    return verdicts


def chain_reward(verdicts: list[dict[str, Any]]) -> float:
    """The weighted fraction passed: sum(weight x score) / sum(weight), skipped ones counting 0."""
    total = sum(v["weight"] for v in verdicts)
    return sum(v["weight"] * v["score"] for v in verdicts) / total if total else 0.0


def apply_rubric_chain(
    out: dict[str, Any],
    run: dict[str, Any],
    spec: dict[str, Any],
    judge: Judge | None,
    threshold: float | None,
) -> dict[str, Any]:
    """Fold a rubric chain (``spec["criteria"]``) into a scored claw.outcome/v1 dict: its
    ``details.criteria`` verdicts, ``details.rubric_score`` and the blended reward; returns it."""
    if out.get("status") != "ok":
        return out
    if judge is None:
        return no_judge(out, spec)
    details = out.setdefault("details", {})
    details["grading"] = spec.get("grading", "rubric_chain")
    criteria = parse_criteria(spec.get("criteria"), "run meta.judge")
    stdout = run.get("stdout_tail")
    evidence = evidence_text(
        str(spec.get("instruction", "")),
        workspace_files(run.get("collected")),
        stdout if isinstance(stdout, str) else "",
    )
    try:
        verdicts = judge_chain(judge, criteria, evidence)
    except RubricError as exc:
        details.update(criteria=exc.verdicts, judge_model=judge.model)
        out.update(status="infra_error", reward=None, passed=None, error=str(exc))
        return out
    details.update(criteria=verdicts, judge_model=judge.model)
    # unblended and without a threshold, passed = reward >= 1 = every criterion passed
    return finish_judged(out, run, spec, chain_reward(verdicts), threshold, key="rubric_score")


_PB_CRITERION = re.compile(
    r"^###\s+Criterion\s+(\d+)\s*:\s*(.+?)(?:\s*\(\s*Weight\s*:\s*(\d+(?:\.\d+)?)\s*%?\s*\))?\s*$",
    re.M | re.I,
)


def pinchbench_criteria(rubric: str) -> list[dict[str, Any]] | None:
    """The criteria of a PinchBench ``## LLM Judge Rubric`` written as ``### Criterion N: Name
    (Weight: W%)`` sections of score levels: graded criteria ``criterion_N`` weighted W (all
    equal when a section gives no weight); None for a rubric of another shape (judged whole)."""
    heads = list(_PB_CRITERION.finditer(rubric))
    if not heads:
        return None
    weighted = all(m.group(3) for m in heads)
    out = []
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(rubric)
        body = rubric[m.end() : end].strip()
        out.append(
            {
                "id": f"criterion_{m.group(1)}",
                "text": f"{m.group(2).strip()}\n\n{body}".strip(),
                "weight": float(m.group(3)) if weighted else 1.0,
                "scale": "graded",
            }
        )
    return out


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
