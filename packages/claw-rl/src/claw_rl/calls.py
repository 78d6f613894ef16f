"""``claw.call/v1`` records -> single-path samples, for ``claw-rl logprobs`` (the consistency
check on its own: recompute the learner's logprobs of the recorded completion tokens).

The call reader is a *projection* (docs/formats.md, Readers): it validates the fields it reads
(``call_id``, ``trainable``, ``prompt_ids``, ``completion_ids``, ``completion_logprobs``) and
accepts anything in the others."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import torch

from claw_rl.consistency import finish_mismatch, mismatch_stats
from claw_rl.errors import RecordError
from claw_rl.packing import chain_sample
from claw_rl.records import CALL_SCHEMA, Sample, _check_schema, iter_jsonl


def call_to_sample(row: dict, where: str) -> Sample | None:
    """A chain sample (prompt as context, completion trainable) or None for untrainable calls."""
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
        if not isinstance(val, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in val):
            raise RecordError(f"{where}: field {key!r} must be a list of token ids >= 0")
    if not isinstance(lp, list) or not all(
        isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in lp
    ):
        raise RecordError(f"{where}: field 'completion_logprobs' must be a list of finite numbers")
    if len(lp) != len(c):
        raise RecordError(f"{where}: completion_logprobs has {len(lp)} entries, completion_ids has {len(c)}")
    if not p or not c:
        return None
    return chain_sample(str(row["call_id"]), p, c, lp, tags={"where": where})


def iter_call_samples(path: str | Path) -> Iterator[tuple[dict, Sample]]:
    """(call row, sample) for each trainable call of a JSONL file (others are skipped, counted)."""
    for where, row in iter_jsonl(path):
        s = call_to_sample(row, where)
        if s is not None:
            yield row, s


def compare(sample: Sample, learner_lp: list[float], threshold: float) -> dict:
    """Mismatch of one call: learner vs engine logprobs on its completion tokens."""
    tr = [i for i, t in enumerate(sample.trainable) if t]
    mine = torch.tensor([learner_lp[i] for i in tr], dtype=torch.float64)
    eng = torch.tensor([sample.logprobs[i] for i in tr], dtype=torch.float64)
    return mismatch_stats(mine, eng, threshold)


__all__ = ["call_to_sample", "compare", "finish_mismatch", "iter_call_samples"]
