"""``claw.call/v1`` records -> single-path samples, for ``claw-rl logprobs`` (the consistency
check on its own: recompute the learner's logprobs of the recorded completion tokens).

The call reader is a *projection* (docs/formats.md, Readers): it validates the fields it reads
(``call_id``, ``trainable``, ``prompt_ids``, ``completion_ids``, ``completion_logprobs``,
``completion_kept``, ``sampling.temperature`` / ``top_p`` / ``top_k``, ``prefix.reused_tokens`` /
``parent_call``, ``routing``) and accepts anything in the others.

A call's ``completion_kept`` (the engine's kept-set sizes) becomes its sample's ``kept``; its MoE
``routing`` (docs/formats.md, Routing store) becomes the sample's routing, held in memory, with
the rows before ``routing.start`` taken from the ``prefix.parent_call`` chain in the same file
(:mod:`claw_rl._call_routing`): the learner replays them as it replays a sample's (R3)."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import torch

from claw_rl._call_routing import CallRoutes, call_prefix, call_routing
from claw_rl.consistency import finish_mismatch, mismatch_stats
from claw_rl.errors import RecordError
from claw_rl.packing import chain_sample
from claw_rl.records import CALL_SCHEMA, Sample, _check_schema, iter_jsonl

if TYPE_CHECKING:
    pass


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


def _completion_kept(row: dict, where: str, n_c: int) -> tuple[int, ...] | None:
    """A call's ``completion_kept`` (ints >= -1, one per completion token), None when absent."""
    kept = row.get("completion_kept")
    if kept is None:
        return None
    if not isinstance(kept, list):
        raise RecordError(f"{where}: field 'completion_kept' must be a list, got {kept!r:.40}")
    for j, x in enumerate(kept):
        if not isinstance(x, int) or isinstance(x, bool) or x < -1:
            raise RecordError(
                f"{where}: field 'completion_kept'[{j}] must be an integer >= -1, got {x!r:.40}"
            )
    if len(kept) != n_c:
        raise RecordError(
            f"{where}: field 'completion_kept' has {len(kept)} entries, completion_ids has {n_c}"
        )
    return tuple(kept)


def _check_call(row: dict, where: str) -> None:
    """The required fields of a trainable call: id, token ids and engine logprobs."""
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


def call_to_sample(
    row: dict,
    where: str,
    *,
    temperature: float | None = None,
    routes: CallRoutes | None = None,
) -> Sample | None:
    """A chain sample (prompt as context, completion trainable) or None for untrainable calls.

    The completion tokens carry the call's ``sampling`` settings; ``temperature`` (> 0), when
    given, replaces the recorded temperature (an explicit override, e.g. for records whose
    proxy sampled at another temperature than it wrote down); top_p / top_k stay as recorded.
    ``completion_kept`` becomes the sample's ``kept`` (-1 on the prompt). The call's
    ``routing`` is validated here; it becomes the sample's routing (held in memory) only with
    ``routes``, the calls of its file that resolve the rows before ``routing.start``
    (:func:`read_call_samples` passes them).
    """
    _check_schema(row, CALL_SCHEMA, where)
    trainable = row.get("trainable", True)
    if not isinstance(trainable, bool):
        raise RecordError(f"{where}: field 'trainable' must be a boolean, got {trainable!r}")
    if not trainable:
        return None
    _check_call(row, where)
    p, c, lp = row["prompt_ids"], row["completion_ids"], row["completion_logprobs"]
    kept = _completion_kept(row, where, len(c))
    call_prefix(row, where)
    base = routes.base if routes is not None else Path(os.getcwd())
    ref = call_routing(row, where, base, tuple(p) + tuple(c))
    if not p or not c:
        return None
    t, top_p, top_k = call_sampling(row, where)
    if temperature is not None:
        t = temperature
    n_p, n_c = len(p), len(c)
    extra: dict = {}
    if kept is not None:
        extra["kept"] = (-1,) * n_p + kept
    if ref is not None and routes is not None:
        routes.add(where, row)
        extra["routing"] = routes.rows(row["call_id"])
    return chain_sample(
        str(row["call_id"]),
        p,
        c,
        lp,
        tags={"where": where},
        temperatures=(1.0,) * n_p + (t,) * n_c,
        top_ps=(1.0,) * n_p + (top_p,) * n_c,
        top_ks=(0,) * n_p + (top_k,) * n_c,
        **extra,
    )


@attrs.define
class CallSamples:
    """The trainable calls of a file as samples, and what resolving their routing left open:
    ``missing_parents`` calls whose ``prefix.parent_call`` is not in the file (or has no
    routing), ``unrouted_tokens`` the tokens before ``routing.start`` left -1 for the learner."""

    pairs: list[tuple[dict, Sample]]
    missing_parents: int = 0
    unrouted_tokens: int = 0


def read_call_samples(path: str | Path, *, temperature: float | None = None) -> CallSamples:
    """(call row, sample) for each trainable call of a JSONL file (others are skipped); the
    routing of every call resolved against the other calls of the file; ``temperature``: see
    :func:`call_to_sample`."""
    routes = CallRoutes(base=Path(os.getcwd()) if str(path) == "-" else Path(path).parent)
    lines = list(iter_jsonl(path))  # the whole file first: a parent may follow its child
    for where, row in lines:
        routes.add(where, row)
    pairs = []
    for where, row in lines:
        s = call_to_sample(row, where, temperature=temperature, routes=routes)
        if s is not None:
            pairs.append((row, s))
    return CallSamples(pairs, routes.missing, routes.unrouted)


def iter_call_samples(
    path: str | Path, *, temperature: float | None = None
) -> Iterator[tuple[dict, Sample]]:
    """The pairs of :func:`read_call_samples`."""
    yield from read_call_samples(path, temperature=temperature).pairs


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


__all__ = [
    "CallSamples",
    "call_sampling",
    "call_to_sample",
    "compare",
    "finish_mismatch",
    "iter_call_samples",
    "read_call_samples",
]
