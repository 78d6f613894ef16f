"""The learner's step metrics that are not part of the losses: staleness, the critic's fit, the
batch's shape and speed, an MoE model's routing. Sums over ranks go through :mod:`claw_rl._dist`."""

from __future__ import annotations

import math

import attrs
import numpy as np
import torch

from claw_rl import _dist
from claw_rl._moe import expert_load, flip_rate
from claw_rl.packing import Batch, leaf_counts, session_index, session_units, trajectory_tokens
from claw_rl.records import Sample


def session_ages(sample: Sample, version: int) -> list[int]:
    """Per session of the sample (one entry for a sample without sessions): the learner version
    minus the oldest policy version of the session's trainable tokens (0 when unknown).
    Staleness is decided per session: a group-packed sample holds several rollouts, and a
    stale one must not take its siblings with it."""
    n = session_units(sample)
    if sample.policy_versions is None:
        return [0] * n
    v = np.asarray(sample.policy_versions, dtype=np.int64)
    known = np.asarray(sample.trainable, dtype=bool) & (v >= 0)
    sess = session_index(sample)
    out = []
    for k in range(n):
        vs = v[known & (sess == k)]
        out.append(version - int(vs.min()) if len(vs) else 0)
    return out


def staleness(ages: list[list[int]], stale: list[list[bool]]) -> dict:
    """``ages`` / ``stale``: per sample, per session."""
    flat = [a for per in ages for a in per]
    return {
        "staleness_max": max(flat),
        "staleness_mean": sum(flat) / len(flat),
        "stale_samples": sum(any(per) for per in stale),
        "stale_sessions": sum(sum(per) for per in stale),
        "dropped_stale": 0,
    }


def values(samples: list[Sample], old: dict[int, dict[str, torch.Tensor]]) -> dict:
    """Explained variance of the old values (``old[k]["values_old"]``, this rank's samples k)
    against the returns, over every trainable token of the batch (all ranks)."""
    own = sorted(old)
    R = torch.tensor(
        [
            r
            for k in own
            for r, t in zip(samples[k].returns or (), samples[k].trainable, strict=True)
            if t
        ],
        dtype=torch.float64,
    )
    v = (
        torch.cat([old[k]["values_old"].double().cpu() for k in own])
        if own
        else torch.zeros(0, dtype=torch.float64)
    )
    s = _dist.reduce_sums(
        {
            "n": float(R.numel()),
            "R": float(R.sum()),
            "R2": float((R * R).sum()),
            "D": float((R - v).sum()),
            "D2": float(((R - v) ** 2).sum()),
        }
    )
    n = max(s["n"], 1)
    var_R = s["R2"] / n - (s["R"] / n) ** 2
    var_D = s["D2"] / n - (s["D"] / n) ** 2
    return {
        "explained_variance": 1.0 - var_D / var_R if s["n"] > 1 and var_R > 1e-12 else math.nan,
        "value_mean": float(v.mean()) if v.numel() else 0.0,
        "return_mean": s["R"] / n,
    }


def batch(samples: list[Sample], n_tokens: int, wall: float) -> dict:
    """Size, deduplication and speed of the step, and the advantages as given.

    Of the samples trained (after stale sessions were dropped): ``tokens`` packed, ``flat_tokens``
    = the tokens of their trajectories (paths with a trainable token) each as its own sequence,
    ``tree_ratio`` = flat_tokens / tokens (what tree and group packing saved against the flat
    per-trajectory batch whose loss they equal), ``dedup_factor`` = every root-to-leaf path's
    tokens / tokens (context-only paths included)."""
    packed = sum(len(s) for s in samples)
    flat = sum(float(leaf_counts(s.parent).sum()) for s in samples)
    flat_traj = sum(trajectory_tokens(s.parent, s.trainable) for s in samples)
    adv = torch.tensor(
        [a for s in samples for a, t in zip(s.advantages, s.trainable, strict=True) if t]
    )
    return {
        "samples": len(samples),
        "tokens": packed,
        "trainable_tokens": n_tokens,
        "flat_tokens": flat_traj,
        "tree_ratio": flat_traj / max(packed, 1),
        "dedup_factor": flat / max(packed, 1),
        "tokens_per_s": packed / wall,
        "step_time_s": wall,
        "adv_mean": float(adv.mean()) if adv.numel() else 0.0,
        "zero_adv_frac": float((adv == 0).float().mean()) if adv.numel() else 0.0,
    }


def signal(
    samples: list[Sample],
    mass: list[np.ndarray],
    adv_mean: float,
    adv_scale: float,
    uses_advantages: bool,
) -> dict:
    """``no_signal`` (bool) and, when True, ``no_signal_reason``: the policy loss of this batch is
    zero whatever the weights - no trainable token carries loss mass, or (an objective on
    advantages) every advantage of those tokens is 0 as the loss sees it (after whitening; within
    1e-9, the rounding error of a centred batch of equal values). ``mass``: q per trainable
    token of each sample. A critic, KL or entropy term may still move the weights."""
    q = np.concatenate(mass) if mass else np.zeros(0)
    reason = None
    if not (q > 0).any():
        reason = "no trainable token carries loss weight"
    elif uses_advantages:
        raw = np.concatenate(
            [np.asarray(s.advantages)[np.asarray(s.trainable, dtype=bool)] for s in samples]
        )[q > 0]
        if np.abs((raw - adv_mean) / adv_scale).max() <= 1e-9:
            reason = (
                "every advantage is 0 (critic-free: the rewards within each group are equal)"
                if np.abs(raw).max() <= 1e-9
                else "every advantage equals the batch mean, which whitening subtracts"
            )
    return {"no_signal": reason is not None, **({"no_signal_reason": reason} if reason else {})}


def finite(metrics: dict) -> dict:
    """NaN / inf floats as None (JSON has neither)."""
    return {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v)
        for k, v in metrics.items()
    }


@attrs.define
class RoutingTally:
    """The MoE routing metrics of a step's first pass (pi_old), summed over its micro-batches:
    flips of the live top-k against the recorded rows, recorded rows, and each expert's load."""

    layers: int
    num_experts: int
    flipped: int = 0
    compared: int = 0
    recorded: int = 0
    rows: int = 0
    load: torch.Tensor = attrs.field(default=None)  # (L, E) float64: real tokens' assignments

    def __attrs_post_init__(self) -> None:
        self.load = torch.zeros(self.layers, self.num_experts, dtype=torch.float64)

    def add(self, used: torch.Tensor, live: torch.Tensor, batch: Batch) -> None:
        """One micro-batch: ``used`` / ``live`` (B, N, L, K) experts in batch order."""
        real = (
            torch.arange(used.shape[1], device=used.device)[None, :]
            < torch.tensor(batch.lengths, device=used.device)[:, None]
        )  # (B, N)
        self.rows += int(real.sum()) * used.shape[2]
        if batch.routing is not None:
            flipped, compared = flip_rate(live, batch.routing)  # padding rows are -1
            self.flipped, self.compared = self.flipped + flipped, self.compared + compared
            self.recorded += compared
        self.load += expert_load(used, self.num_experts, real).cpu().to(torch.float64)

    def finish(self) -> dict:
        """``routing_flip_rate`` (flipped / compared recorded (token, layer) rows; absent when
        none is recorded), ``routing_recorded_fraction`` (recorded rows / rows of real tokens),
        ``expert_load_max`` (max over layers of the busiest expert's share x E: 1 = balanced,
        E = one expert takes everything), over all ranks."""
        s = _dist.reduce_sums(
            {
                "flipped": self.flipped,
                "compared": self.compared,
                "recorded": self.recorded,
                "rows": self.rows,
            }  # fmt: skip
        )
        load = _dist.all_reduce_sum(self.load.clone())
        share = load.max(1).values / load.sum(1).clamp(min=1)  # (L,)
        out = {
            "routing_recorded_fraction": s["recorded"] / max(s["rows"], 1),
            "expert_load_max": float(share.max()) * self.num_experts,
        }
        if s["compared"]:
            out["routing_flip_rate"] = s["flipped"] / s["compared"]
        return out
