"""The parts a :class:`claw_rl.learner.Learner` is made of, besides the policy and the critic
(:class:`claw_rl.critic.Critic`):

* an :class:`Objective` - the policy's per-token loss, aggregated: :class:`ClippedSurrogate`
  (PPO / GRPO, Schulman et al. 2017, eq. 7) or :class:`WeightedNLL` (supervised fine-tuning);
* a :class:`Correction` - the training-inference importance weights and masks (TIS / MIS);
* an :class:`Aggregation` - how per-token losses become one scalar per minibatch;
* an optional :class:`Reference` - a frozen model and its KL penalty.

Every token tensor here is (M,): one entry per trainable token, in ``batch.predictor_index()``
order. ``old`` maps names to such tensors: ``logp_old``, ``is_w``, ``keep`` and, with the
matching part, ``logp_ref`` and ``values_old``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import attrs
import numpy as np
import torch

from claw_rl import losses
from claw_rl.consistency import mis_sequence_keep, mis_token_mask, path_shares, tis_weights
from claw_rl.errors import ClawError
from claw_rl.forward import backbone_hidden, moe_hidden, token_logprobs
from claw_rl.packing import Batch, leaf_counts, path_matrix, trainable_paths
from claw_rl.records import Sample

Tokens = dict[str, torch.Tensor]


def load_policy(model_dir: str | Path, dtype: torch.dtype) -> torch.nn.Module:
    """An HF causal LM in eval mode (dropout off: pi_old and pi_theta are the same function at
    epoch 1). A PEFT adapter directory gives its base model with the adapter merged in."""
    from transformers import AutoModelForCausalLM

    from claw_rl import _lora

    if _lora.is_adapter(model_dir):
        return _lora.merged(model_dir, load_policy(_lora.base_of(model_dir), dtype)).eval()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype=dtype, attn_implementation="sdpa"
        )
    except (OSError, ValueError) as exc:
        raise ClawError(f"{model_dir}: cannot load an HF causal LM ({exc})") from exc
    model.eval()
    return model


# -- aggregation ----------------------------------------------------------------------------


@attrs.frozen
class Aggregation:
    """How per-token losses become one scalar: ``weights`` (claw-tree's loss weights, the exact
    per-trajectory mean), ``token_mean`` (DAPO) or ``constant`` (Dr. GRPO, ``constant_len``)."""

    kind: str = "weights"
    constant_len: int = 1

    def mass(self, sample: Sample) -> np.ndarray:
        """q per trainable token: its mass in the loss - the loss weight for ``weights``, the
        number of paths through it (its copies in the flat batch) otherwise."""
        tr = np.asarray(sample.trainable, dtype=bool)
        if self.kind == "weights":
            return np.asarray(sample.loss_weights, dtype=np.float64)[tr]
        return leaf_counts(sample.parent)[tr]

    def for_minibatch(
        self, samples: list[Sample], mass: np.ndarray, kept: np.ndarray
    ) -> Aggregator:
        """The aggregator of one minibatch (all ranks): ``mass`` / ``kept`` per sample of it."""
        n_traj = 0.0
        if self.kind == "constant":  # trajectories: paths with a trainable token (not a
            # passthrough or token-counting call's context-only path)
            n_traj = float(sum(trainable_paths(s.parent, s.trainable) for s in samples))
        return Aggregator(
            kind=self.kind,
            full=float(mass.sum()),
            kept=float(kept.sum()),
            n_traj=max(n_traj, 1.0),
            constant_len=float(self.constant_len),
        )


@attrs.frozen
class Aggregator:
    """One minibatch's aggregation of per-token losses l (M,) into a scalar, exact on trees.

    q_i = the token's mass in the flat per-path batch (loss weight, or paths through it); m_i =
    the MIS keep fraction. ``loss(l, masked=True)`` = sum q m l / sum_minibatch q m (masked
    tokens leave the denominator) for weights and token_mean, sum c m l / (n_traj L) for
    constant (Dr. GRPO's constant normaliser); ``mean(x)`` = sum q x / sum_minibatch q, the
    per-path (flat-batch) mean of a diagnostic. Sums over micro-batches and ranks add up.
    """

    kind: str  # weights | token_mean | constant
    full: float  # sum of q over the minibatch's trainable tokens
    kept: float  # sum of q * m over them
    n_traj: float
    constant_len: float

    def tok(self, batch: Batch, keep: torch.Tensor) -> Tokens:
        b, i, _ = batch.predictor_index()
        c = batch.leaf_counts[b, i]
        return {"q": batch.loss_weights[b, i] if self.kind == "weights" else c, "c": c, "m": keep}

    def loss(self, lt: torch.Tensor, tok: Tokens, masked: bool = False) -> torch.Tensor:
        if masked:
            lt = lt * tok["m"]
        if self.kind == "constant":
            return losses.constant_sum(lt, tok["c"], self.n_traj, self.constant_len)
        denom = self.kept if masked else self.full
        return losses.weighted_sum(lt, tok["q"]) * (1.0 / denom if denom > 0 else 0.0)

    def mean(self, x: torch.Tensor, tok: Tokens) -> torch.Tensor:
        return losses.weighted_sum(x.to(tok["q"].dtype), tok["q"]) * (
            1.0 / self.full if self.full > 0 else 0.0
        )


# -- objectives -------------------------------------------------------------------------------


class Objective(Protocol):
    """The policy's loss on one micro-batch: ``(aggregated loss, clipped (M,))``.

    ``lp`` = log pi_theta (M,) with gradient, ``A`` = the (whitened) advantages (M,).
    ``at_sampling_settings``: True - each token's logprob is that of the distribution it was
    sampled from (the samples' temperatures / top_ps / top_ks); False - the model's own
    distribution at temperature 1 (the learner ignores the recorded settings).
    """

    @property
    def at_sampling_settings(self) -> bool: ...

    def __call__(
        self, lp: torch.Tensor, old: Tokens, A: torch.Tensor, agg: Aggregator, tok: Tokens
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


@attrs.frozen
class ClippedSurrogate:
    """PPO's clipped surrogate (Schulman et al. 2017, eq. 7) times the TIS weight, aggregated
    over the tokens MIS keeps (see :func:`claw_rl.losses.ppo_clip_loss`)."""

    eps_low: float = 0.2
    eps_high: float = 0.2
    at_sampling_settings: bool = True

    def __call__(
        self, lp: torch.Tensor, old: Tokens, A: torch.Tensor, agg: Aggregator, tok: Tokens
    ) -> tuple[torch.Tensor, torch.Tensor]:
        pg, clipped = losses.ppo_clip_loss(lp, old["logp_old"], A, self.eps_low, self.eps_high)
        return agg.loss(pg * old["is_w"], tok, masked=True), clipped


@attrs.frozen
class WeightedNLL:
    """Supervised fine-tuning: -log pi_theta per trainable token, aggregated like the RL loss
    (``weights``: sum_i w_i (-log pi_i) / sum_i w_i, the per-token-weighted mean NLL) at
    temperature 1. No ratio, no importance weight, no advantage; nothing is ever clipped."""

    at_sampling_settings: bool = False

    def __call__(
        self, lp: torch.Tensor, old: Tokens, A: torch.Tensor, agg: Aggregator, tok: Tokens
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return agg.loss(-lp, tok), torch.zeros_like(lp.detach())


# -- training-inference correction ----------------------------------------------------------


@attrs.frozen
class Correction:
    """Training-inference correction (``tis``, ``mis_token``, ``mis_sequence`` or ``none``):
    ``cap`` = TIS truncation C / MIS upper bound, ``low`` = MIS lower bound on pi_old /
    pi_engine, ``seq_tol`` = the band of sequence MIS on a path's geometric mean."""

    kind: str = "none"
    cap: float = 2.0
    low: float = 0.5
    seq_tol: float = 0.01

    def weights(
        self, lp_old: torch.Tensor, lp_eng: torch.Tensor, sample: Sample, agg_kind: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(is_w, keep)`` per trainable token of ``sample``: the TIS weight (1 unless tis) and
        the MIS keep fraction (1 unless mis_*); masked tokens leave the loss's denominator,
        weighted ones do not."""
        ones = torch.ones_like(lp_old)
        if self.kind == "tis":
            return tis_weights(lp_old, lp_eng, self.cap), ones
        if self.kind == "mis_token":
            return ones, mis_token_mask(lp_old, lp_eng, self.low, self.cap)
        if self.kind == "mis_sequence":
            tr = torch.tensor(sample.trainable, dtype=torch.bool)
            log_rho = torch.zeros(len(sample), dtype=torch.float64)
            log_rho[tr] = (lp_old - lp_eng).double().cpu()
            paths = torch.from_numpy(path_matrix(sample.parent))
            # a shared token's weight is split over its paths as the aggregator's flat batch does:
            # path counts for token_mean / constant; claw-tree's own split for the loss weights
            split = (sample.tags or {}).get("path_weighting")
            weighted = agg_kind == "weights" and split in ("rollout", "path")
            kind = "inverse_length" if weighted else "equal"
            keep = mis_sequence_keep(log_rho, paths, tr, self.seq_tol, path_shares(paths, tr, kind))
            return ones, keep[tr].to(lp_old)
        return ones, ones


# -- reference --------------------------------------------------------------------------------


@attrs.define(eq=False)
class Reference:
    """A frozen reference policy and the KL penalty toward it: ``kl_coef`` times the ``k3``
    (default) or ``k2`` loss of :mod:`claw_rl.losses`, both with the gradient of KL(pi || ref)."""

    model: torch.nn.Module
    kl_coef: float
    estimator: str = "k3"

    def logprobs(self, batch: Batch, replay: torch.Tensor | None = None) -> torch.Tensor:
        """log pi_ref (M,) of the batch's trainable tokens, under their sampling settings; an MoE
        reference given ``replay`` (B, N, L, K, batch order) sends each token to those experts."""
        if replay is None:
            hidden = backbone_hidden(self.model, batch)
        else:
            hidden = moe_hidden(self.model, batch, replay)[0]
        return token_logprobs(self.model, hidden, batch, with_entropy=False).logprobs

    def kl(self, lp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
        """Per-token KL penalty (M,) to minimise."""
        fn = losses.kl_k3_loss if self.estimator == "k3" else losses.kl_k2_loss
        return fn(lp, logp_ref)
