"""``claw.call/v1`` records -> single-path samples, for ``claw-rl logprobs`` (the consistency
check on its own: recompute the learner's logprobs of the recorded completion tokens).

The call reader is a *projection* (docs/formats.md, Readers): it validates the fields it reads
(``call_id``, ``trainable``, ``prompt_ids``, ``completion_ids``, ``completion_logprobs``,
``sampling.temperature`` / ``top_p`` / ``top_k``) and accepts anything in the others."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import torch

from claw_rl.consistency import finish_mismatch, mismatch_stats
from claw_rl.errors import RecordError
from claw_rl.packing import chain_sample
from claw_rl.records import CALL_SCHEMA, Sample, _check_schema, iter_jsonl


def call_sampling(row: dict, where: str) -> tuple[float, float, int]:
    """``(temperature, top_p, top_k)`` of a call's ``sampling`` (absent = 1, 1, 0: older proxies)."""
    s = row.get("sampling")
    if s is None:
        return 1.0, 1.0, 0
    if not isinstance(s, dict):
        raise RecordError(f"{where}: field 'sampling' must be an object")
    t, p, k = s.get("temperature", 1.0), s.get("top_p", 1.0), s.get("top_k", 0)
    for key, v in (("temperature", t), ("top_p", p)):
        if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
            raise RecordError(f"{where}: field 'sampling.{key}' must be a finite number, got {v!r}")
    if t < 0:
        raise RecordError(
            f"{where}: field 'sampling.temperature' = {t!r} must be >= 0 (0 = greedy)"
        )
    if not 0 < p <= 1:
        raise RecordError(f"{where}: field 'sampling.top_p' = {p!r} must lie in (0, 1]")
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise RecordError(
            f"{where}: field 'sampling.top_k' = {k!r} must be an integer >= 0 (0 = off)"
        )
    return float(t), float(p), k


def call_to_sample(row: dict, where: str, *, temperature: float | None = None) -> Sample | None:
    """A chain sample (prompt as context, completion trainable) or None for untrainable calls.

    The completion tokens carry the call's ``sampling`` settings; ``temperature`` (> 0), when
    given, replaces the recorded temperature (an explicit override, e.g. for records whose
    proxy sampled at another temperature than it wrote down); top_p / top_k stay as recorded.
    """
    _check_schema(row, CALL_SCHEMA, where)
    trainable = row.get("trainable", True)
    if not isinstance(trainable, bool):
        raise RecordError(f"{where}: field 'trainable' must be a boolean, got {trainable!r}")
    if not trainable:
        return None
    for key in ("call_id", "prompt_ids", "completion_ids", "completion_logprobs"):
        if key not in row:
            raise RecordError(f"{where}: missing required field {key!r}")
    if not isinstance(row["call_id"], str) or not row["call_id"]:
        raise RecordError(f"{where}: field 'call_id' must be a non-empty string")
    p, c, lp = row["prompt_ids"], row["completion_ids"], row["completion_logprobs"]
    for key, val in (("prompt_ids", p), ("completion_ids", c)):
        if not isinstance(val, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in val
        ):
            raise RecordError(f"{where}: field {key!r} must be a list of token ids >= 0")
    if not isinstance(lp, list) or not all(
        isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in lp
    ):
        raise RecordError(f"{where}: field 'completion_logprobs' must be a list of finite numbers")
    if len(lp) != len(c):
        raise RecordError(
            f"{where}: completion_logprobs has {len(lp)} entries, completion_ids has {len(c)}"
        )
    if not p or not c:
        return None
    t, top_p, top_k = call_sampling(row, where)
    if temperature is not None:
        t = temperature
    n_p, n_c = len(p), len(c)
    return chain_sample(
        str(row["call_id"]),
        p,
        c,
        lp,
        tags={"where": where},
        temperatures=(1.0,) * n_p + (t,) * n_c,
        top_ps=(1.0,) * n_p + (top_p,) * n_c,
        top_ks=(0,) * n_p + (top_k,) * n_c,
    )


def iter_call_samples(
    path: str | Path, *, temperature: float | None = None
) -> Iterator[tuple[dict, Sample]]:
    """(call row, sample) for each trainable call of a JSONL file (others are skipped, counted);
    ``temperature``: see :func:`call_to_sample`."""
    for where, row in iter_jsonl(path):
        s = call_to_sample(row, where, temperature=temperature)
        if s is not None:
            yield row, s


def compare(sample: Sample, learner_lp: list[float], threshold: float) -> dict:
    """Mismatch of one call: learner vs engine logprobs on its completion tokens.

    Greedy tokens (temperature 0: the engine drew from a point mass and recorded 0.0) have no
    distribution to compare with; they are left out and counted in ``greedy``.
    """
    temps = sample.temperatures or (1.0,) * len(sample)
    tr = [i for i, t in enumerate(sample.trainable) if t and temps[i] > 0]
    mine = torch.tensor([learner_lp[i] for i in tr], dtype=torch.float64)
    eng = torch.tensor([sample.logprobs[i] for i in tr], dtype=torch.float64)
    greedy = sum(1 for i, t in enumerate(sample.trainable) if t and temps[i] <= 0)
    return {**mismatch_stats(mine, eng, threshold), "greedy": float(greedy)}


__all__ = ["call_sampling", "call_to_sample", "compare", "finish_mismatch", "iter_call_samples"]
