"""One learner over tree-packed samples, made of parts: a policy, an objective, a training-
inference correction, an aggregation, and optionally a critic and a reference.

    learner = Learner.grpo(GRPOConfig(lr=1e-5), "runs/tiny")  # or .ppo(PPOConfig()), .sft(SFTConfig())
    metrics = learner.step(samples)          # list of claw.sample/v1 dicts -> metrics dict
    policy = save_policy(learner, "runs/p/v1")   # claw_rl.checkpoint: HF dir + claw.policy/v1
    save_checkpoint(learner, "runs/ckpt")        # ... load_checkpoint("runs/ckpt")

One step, in three phases:

1. **old logprobs** - drop or report stale samples; recompute log pi_old of the recorded tokens
   (and the critic's old values, the reference's logprobs); compare with the engine's logprobs
   (mismatch report); importance weights (TIS / MIS); whiten the advantages (PPO); the kept set
   of every top_k / top_p token is decided here, once, and replayed by every pass of phase 2;
2. **losses** - per minibatch: objective (clipped surrogate; weighted NLL for SFT) - entropy
   bonus + KL penalty + value loss, backward;
3. **update** - sum gradients over ranks, clip the norm, AdamW step (a non-finite loss,
   gradient or resulting weight fails the step: nothing is saved);

phases 2-3 repeat ``epochs`` x ``minibatches`` times.

A batch without learning signal (``no_signal``: every advantage 0 as the loss sees it, or no
trainable token with loss weight) does not update the policy: no AdamW step on its parameters
(whose momentum and weight decay would move every weight), its KL and entropy terms included,
so the learner is not ``dirty`` and the next :func:`~claw_rl.checkpoint.save_policy` keeps the
version (engines need not reload); the metrics say ``skipped`` and ``policy_updates: 0``. The
ranks decide this together. The learning-rate schedule counts policy updates, so such a step does
not advance it. PPO's critic still learns from the batch (its value loss has a target whatever
the advantages): its epochs x minibatches steps run on the critic's parameters alone
(``critic_updates``); its new weights go into the checkpoint and are published with the next
policy version. Under torchrun each rank forwards its share
of every minibatch (:mod:`claw_rl._dist` keeps the bookkeeping: padding passes under FSDP,
gradient sums, reductions of the metrics).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch

from claw_rl import _dist, _lora, _metrics, _moe, losses
from claw_rl.config import GRPOConfig, PPOConfig, TrainConfig
from claw_rl.consistency import finish_mismatch, mismatch_stats, replays_policy_routing
from claw_rl.critic import Critic
from claw_rl.errors import ClawError
from claw_rl.forward import (
    Routed,
    backbone_hidden,
    entropy,
    moe_hidden,
    sampling_log_softmax,
    token_logprobs,
)
from claw_rl.packing import Batch, keep_sessions, pack, to_device
from claw_rl.parts import (
    Aggregation,
    ClippedSurrogate,
    Correction,
    Objective,
    Reference,
    Tokens,
    WeightedNLL,
    load_policy,
)
from claw_rl.records import Sample, as_samples

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
RL_ALGOS = ("grpo", "ppo", "rloo", "reinforce")  # sample algos the RL recipes train on
_BUILT_FOR = {
    "ppo": "advantages from a critic, train it with Learner.ppo / --algo ppo",
    "sft": "no advantages, train it with Learner.sft / claw-rl sft",
    **dict.fromkeys(
        ("grpo", "rloo", "reinforce"), "critic-free advantages, train it with Learner.grpo"
    ),
}
log = logging.getLogger("claw_rl")
_LOSS_SUMS = ("loss", "pg_loss", "kl", "value_loss", "clip_frac", "approx_kl")


def _default_device(world: int) -> torch.device:
    """cuda (cuda:LOCAL_RANK under torchrun) when a GPU is visible, else cpu."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if world > 1 else "cuda")


@attrs.define
class _Old:
    """What phase 1 hands to the losses: per own sample (global index; every sample when
    minibatches re-balance under torchrun) its old tokens, and per sample of the batch its mass
    in the loss and the part of it MIS kept."""

    tokens: dict[int, Tokens]
    own: list[int]  # the samples this rank forwarded in phase 1 (its part of the metrics)
    n_tokens: int  # trainable tokens of the batch (all ranks), greedy ones included
    mass: np.ndarray  # (n_samples,) sum of q over the sample's trainable tokens
    kept: np.ndarray  # (n_samples,) sum of q * keep
    adv_mean: float = 0.0
    adv_scale: float = 1.0


class Learner:
    """A policy trained by an objective on tree-packed samples; see the module docstring.

    Build one with :meth:`grpo`, :meth:`ppo` or :meth:`sft` (or pass the parts yourself):

    * ``policy`` - an HF causal LM on ``device``, trained at ``config.lr``;
    * ``objective`` - the policy loss (:class:`~claw_rl.parts.ClippedSurrogate`,
      :class:`~claw_rl.parts.WeightedNLL`);
    * ``correction``, ``aggregation``, ``entropy_coef`` - see :mod:`claw_rl.parts`;
    * ``critic`` - adds the value loss and :meth:`values`; needs samples with ``returns``;
    * ``reference`` - adds the KL penalty;
    * ``whiten_std_floor`` - whiten the advantages over the batch (None: use them as given);
    * ``sample_algos`` - the sample ``algo`` values it trains on (others are refused);
    * ``mismatch_threshold`` - the |learner - engine| logprob gap counted in the mismatch report;
    * ``max_staleness`` / ``drop_stale`` - report (and drop) samples more versions old (None:
      no staleness check).

    From ``config`` it reads only :class:`~claw_rl.config.TrainConfig`'s fields (optimizer,
    batching, runtime); the recipes turn the rest of their config into parts.

    ``algo`` names the recipe in checkpoints (:func:`claw_rl.checkpoint.load_checkpoint`).
    """

    def __init__(
        self,
        config: TrainConfig,
        policy: torch.nn.Module,
        *,
        algo: str,
        objective: Objective,
        model_dir: str | Path,
        origin_dir: str | Path | None = None,
        correction: Correction | None = None,
        aggregation: Aggregation | None = None,
        entropy_coef: float = 0.0,
        critic: Critic | None = None,
        reference: Reference | None = None,
        whiten_std_floor: float | None = None,
        whiten_center: bool = True,
        sample_algos: tuple[str, ...] = RL_ALGOS,
        mismatch_threshold: float = 0.1,
        max_staleness: int | None = None,
        drop_stale: bool = False,
        version: int = 0,
        adapter: Any = None,
    ) -> None:
        self.config = config
        self.adapter = adapter  # the peft.PeftModel around policy (LoRA), or None
        self.algo = algo
        self.policy = policy
        self.objective = objective
        self.correction = correction or Correction()  # none
        self.aggregation = aggregation or Aggregation()  # the samples' loss weights
        self.entropy_coef = entropy_coef
        self.critic = critic
        self.reference = reference
        self.whiten_std_floor = whiten_std_floor
        self.whiten_center = whiten_center
        self.sample_algos = sample_algos
        self.mismatch_threshold = mismatch_threshold
        self.max_staleness = max_staleness
        self.drop_stale = drop_stale
        self.model_dir = Path(model_dir)
        self.origin_dir = Path(origin_dir) if origin_dir else self.model_dir
        self.device = next(policy.parameters()).device
        self.rank, self.world = _dist.world()
        self.fsdp = config.parallelism == "fsdp" and self.world > 1
        self.version = version
        self.step_count = 0
        self.dirty = False  # weights changed since the last save (the next save takes a version)
        self.last_metrics: dict = {}
        self.generator = torch.Generator().manual_seed(config.seed)
        # MoE: the routers of the policy's MoE layers and the step's routing replay (None: dense)
        self.routers = _moe.moe_routers(policy)
        self.replay = _replay_mode(config.routing_replay, bool(self.routers))
        # the reference / a separate critic backbone replay the policy pass's experts (R3 / R2)
        self.reference_replays, self.critic_replays = _side_replays(
            self.replay, self.routers, reference, critic
        )
        if self.fsdp and adapter is not None:
            raise ClawError(
                "LoRA (lora_rank > 0) runs under torchrun with parallelism = ddp; fsdp is not "
                "supported with an adapter (the adapter is small: ddp holds it on every rank)"
            )
        if self.fsdp:
            for module in self.sharded_modules():
                _dist.fully_shard_model(module)
        groups = [{"params": _trainable(self.policy), "lr": config.lr, "base_lr": config.lr}]
        if critic is not None:
            params = [p for m in critic.modules().values() for p in _trainable(m)]
            groups.append({"params": params, "lr": critic.lr, "base_lr": critic.lr})
        self.optimizer = torch.optim.AdamW(
            groups,
            betas=(config.adam_beta1, config.adam_beta2),
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
        )
        _dist.broadcast_params(self.params())

    # -- recipes ------------------------------------------------------------------------------
    @classmethod
    def grpo(
        cls,
        config: GRPOConfig,
        model_dir: str | Path,
        *,
        version: int = 0,
        device: str | None = None,
        origin_dir: str | Path | None = None,
    ) -> Learner:
        """Critic-free (GRPO and relatives): the samples' advantages as given, optional KL."""
        if not isinstance(config, GRPOConfig):
            raise ClawError(f"Learner.grpo needs a GRPOConfig, got {type(config).__name__}")
        policy, adapter, dtype, dev, origin = _load(config, model_dir, device, origin_dir)
        reference = None
        if config.kl_coef > 0:
            ref = load_policy(config.ref_model or origin, dtype).to(dev)
            ref.requires_grad_(False)
            reference = Reference(ref, config.kl_coef, config.kl_estimator)
        return cls(
            config,
            policy,
            algo="grpo",
            objective=ClippedSurrogate(config.clip_eps_low, config.clip_eps_high),
            correction=_correction(config),
            aggregation=Aggregation(config.loss_agg, config.constant_len),
            entropy_coef=config.entropy_coef,
            reference=reference,
            sample_algos=("grpo", "rloo", "reinforce"),  # ppo samples' advantages need a critic
            **_checks(config),
            model_dir=model_dir,
            origin_dir=origin,
            version=version,
            adapter=adapter,
        )

    @classmethod
    def ppo(
        cls,
        config: PPOConfig,
        model_dir: str | Path,
        *,
        version: int = 0,
        device: str | None = None,
        origin_dir: str | Path | None = None,
    ) -> Learner:
        """PPO: clipped policy loss on the samples' advantages, clipped value loss on their
        returns. The critic is saved in ``<policy dir>/critic/`` and loaded from there."""
        if not isinstance(config, PPOConfig):
            raise ClawError(f"Learner.ppo needs a PPOConfig, got {type(config).__name__}")
        policy, adapter, dtype, dev, origin = _load(config, model_dir, device, origin_dir)
        critic = Critic.load(
            config.critic,
            Path(model_dir),
            init_dir=config.critic_model or origin,
            policy_hidden_size=policy.config.hidden_size,
            dtype=dtype,
            device=dev,
            lr=config.critic_lr,
            vf_coef=config.vf_coef,
            value_clip=config.value_clip,
        )
        return cls(
            config,
            policy,
            algo="ppo",
            objective=ClippedSurrogate(config.clip_eps_low, config.clip_eps_high),
            correction=_correction(config),
            entropy_coef=config.entropy_coef,
            critic=critic,
            whiten_std_floor=config.whiten_std_floor if config.whiten_advantages else None,
            whiten_center=config.whiten_center,
            **_checks(config),
            model_dir=model_dir,
            origin_dir=origin,
            version=version,
            adapter=adapter,
        )

    @classmethod
    def sft(
        cls,
        config: TrainConfig,
        model_dir: str | Path,
        *,
        version: int = 0,
        device: str | None = None,
        origin_dir: str | Path | None = None,
    ) -> Learner:
        """Supervised fine-tuning on ``algo: sft`` samples (claw-tree sft-samples): the
        loss-weighted mean NLL of the trainable tokens at temperature 1
        (:class:`~claw_rl.parts.WeightedNLL`); no advantages, correction or staleness check."""
        policy, adapter, _, _, origin = _load(config, model_dir, device, origin_dir)
        return cls(
            config,
            policy,
            algo="sft",
            objective=WeightedNLL(),
            sample_algos=("sft",),
            model_dir=model_dir,
            origin_dir=origin,
            version=version,
            adapter=adapter,
        )

    @classmethod
    def from_config(
        cls,
        config: TrainConfig,
        model_dir: str | Path,
        *,
        version: int = 0,
        device: str | None = None,
        origin_dir: str | Path | None = None,
    ) -> Learner:
        """The recipe of ``config.algo`` (``grpo``, ``ppo``, ``sft``)."""
        if isinstance(config, GRPOConfig):
            return cls.grpo(
                config, model_dir, version=version, device=device, origin_dir=origin_dir
            )
        if isinstance(config, PPOConfig):
            return cls.ppo(config, model_dir, version=version, device=device, origin_dir=origin_dir)
        if config.algo == "sft":
            return cls.sft(config, model_dir, version=version, device=device, origin_dir=origin_dir)
        raise ClawError(f"no learner recipe for {type(config).__name__} (algo {config.algo!r})")

    # -- modules --------------------------------------------------------------------------------
    def trained_modules(self) -> dict[str, torch.nn.Module]:
        """Every module the optimizer updates, by a stable name (checkpoint keys)."""
        return {"policy": self.policy, **(self.critic.modules() if self.critic else {})}

    def sharded_modules(self) -> list[torch.nn.Module]:
        """The transformers FSDP shards (policy, reference, critic backbone)."""
        ref = [self.reference.model] if self.reference is not None else []
        backbone = [self.critic.backbone] if self.critic and self.critic.backbone else []
        return [self.policy, *ref, *backbone]

    def params(self) -> list[torch.nn.Parameter]:
        """The optimizer's parameters, in its order."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    # -- inference helpers ------------------------------------------------------------------
    def _micro_batches(
        self, samples: Sequence[Sample], pad_with: Sample | None = None
    ) -> Iterator[tuple[Batch, bool]]:
        """``(batch, is_padding)`` per micro-batch; with ``pad_with``, padding passes under FSDP
        (every rank runs as many forward passes as the busiest one; they count zero)."""
        mb = self.config.micro_batch_size
        parts = [samples[lo : lo + mb] for lo in range(0, len(samples), mb)]
        n = len(parts) if pad_with is None else _dist.passes(len(parts), self.fsdp)
        for k in range(n):
            padding = k >= len(parts)
            rows = [pad_with] if padding and pad_with is not None else parts[k]
            yield to_device(pack(rows), self.device), padding

    def _samples(self, rows: Sequence[Sample | dict]) -> list[Sample]:
        """Validated samples; for an objective on the model's own distribution (SFT), without
        their sampling settings (every token at temperature 1, none greedy)."""
        samples = as_samples(rows)
        if self.replay is not None:
            for s in samples:
                self._check_routing(s)
        if self.objective.at_sampling_settings:
            return samples
        return [
            attrs.evolve(s, temperatures=None, top_ps=None, top_ks=None, kept=None) for s in samples
        ]

    def _check_routing(self, s: Sample) -> None:
        """A sample's recorded routing must fit the policy's MoE layers, top-k and experts."""
        if s.routing is None:
            return
        r0 = self.routers[0]
        want = (len(self.routers), int(r0.top_k), int(r0.num_experts))
        got = (s.routing.layers, s.routing.top_k, s.routing.experts)
        if got != want:
            raise ClawError(
                f"{s.routing.where}: field 'routing': {got[0]} MoE layers x top {got[1]} of "
                f"{got[2]} experts, but the policy has {want[0]} x top {want[1]} of {want[2]}"
            )

    def _hidden(
        self, batch: Batch, replay: torch.Tensor | None, *, live: bool = False
    ) -> tuple[torch.Tensor, Routed | None]:
        """The policy backbone's hidden states; an MoE policy's tokens go to the experts of
        ``replay`` (B, N, L, K; -1 rows and None: the live router's)."""
        if self.replay is None:
            return backbone_hidden(self.policy, batch), None
        return moe_hidden(self.policy, batch, replay, live=live)

    def _recorded(self, batch: Batch) -> torch.Tensor | None:
        """The engine's recorded experts, when r3 replays them."""
        return batch.routing if self.replay == "r3" else None

    def _replayed(self, batch: Batch, old: list[Tokens]) -> torch.Tensor | None:
        """(B, N, L, K): the routing phase 1 merged for each sample (recorded rows, its own
        choices elsewhere), replayed by every later pass of the step; None: live (off, dense, or
        an FSDP padding pass)."""
        if not old or "routing" not in old[0]:
            return None
        first = old[0]["routing"]
        out = torch.full(
            (len(old), batch.input_ids.shape[1], *first.shape[1:]), -1, dtype=torch.long,
            device=first.device,
        )  # fmt: skip
        for k, o in enumerate(old):
            out[k, : o["routing"].shape[0]] = o["routing"]
        return out

    def _values(
        self, batch: Batch, hidden: torch.Tensor | None, replay: torch.Tensor | None
    ) -> torch.Tensor:
        """The critic's V(s_i) (B, N); a separate MoE critic backbone of the policy's layout
        sends each token to the experts of ``replay`` (the policy pass's, batch order)."""
        assert self.critic is not None
        return self.critic.values(batch, hidden, replay if self.critic_replays else None)

    def _ref_logprobs(self, batch: Batch, replay: torch.Tensor | None) -> torch.Tensor:
        """log pi_ref (M,); an MoE reference of the policy's layout sends each token to the
        experts of ``replay`` (the policy pass's, batch order), as the policy did."""
        assert self.reference is not None
        return self.reference.logprobs(batch, replay if self.reference_replays else None)

    def _reshard(self) -> None:
        if self.fsdp:
            _dist.reshard(self.sharded_modules())

    def logprobs(self, samples: Sequence[Sample | dict]) -> list[list[float]]:
        """Learner logprob of each sample's trainable tokens, aligned with its tokens (0 elsewhere)."""
        return self.logprobs_report(samples)[0]

    @torch.no_grad()
    def logprobs_report(self, samples: Sequence[Sample | dict]) -> tuple[list[list[float]], dict]:
        """:meth:`logprobs`, and for an MoE policy the routing report of that pass
        (``routing_flip_rate`` of the live router's top-k against the recorded rows,
        ``routing_recorded_fraction``, ``expert_load_max``); ``{}`` for a dense policy. The pass
        routes as the step's first pass does: r3 to the recorded experts (-1 rows: live), off
        live."""
        out: list[list[float]] = []
        tally = self._tally()
        for batch, _ in self._micro_batches(self._samples(samples)):
            hidden, routed = self._hidden(batch, self._recorded(batch), live=tally is not None)
            if routed is not None and tally is not None:
                assert routed.live is not None
                tally.add(routed.used, routed.live, batch)
            lp = token_logprobs(self.policy, hidden, batch, with_entropy=False).logprobs
            for k, part in enumerate(_split(lp, batch)):
                row = [0.0] * batch.lengths[k]
                for j, v in zip(
                    batch.trainable[k].nonzero().flatten().tolist(), part.tolist(), strict=True
                ):
                    row[j] = v
                out.append(row)
        self._reshard()
        return out, (tally.finish() if tally is not None else {})

    @torch.no_grad()
    def values(self, samples: Sequence[Sample | dict]) -> list[dict]:
        """``{"sample_id", "values"}`` per sample: V(s_i) for every packed token (claw-tree's
        GAE); V(s_i) = value of the prefix before token i, 0 for roots."""
        if self.critic is None:
            raise ClawError(f"this {self.algo} learner has no critic: no values")
        out = []
        for batch, _ in self._micro_batches(self._samples(samples)):
            hidden = (
                self._hidden(batch, self._recorded(batch))[0]
                if self.critic.backbone is None
                else None
            )
            v = self._values(batch, hidden, self._recorded(batch))
            for k, s in enumerate(batch.samples):
                out.append({"sample_id": s.sample_id, "values": v[k, : len(s)].tolist()})
        self._reshard()
        return out

    # -- the step -----------------------------------------------------------------------------
    def step(self, samples: Sequence[Sample | dict]) -> dict:
        """One learner update on a batch of samples (every rank passes the same global batch)."""
        t0 = time.perf_counter()
        c = self.config
        metrics: dict = {
            "step": self.step_count + 1,
            "version": self.version,
            "world_size": self.world,
        }
        samples = self._admit(self._samples(samples), metrics)

        # 1. old logprobs (and values), mismatch against the engine, importance weights
        old = self._old(samples, metrics)

        # no learning signal: the policy is not updated at all (no AdamW step: its momentum and
        # weight decay would move every weight), so it keeps its version. Decided together (one
        # all-reduce): every rank then runs the same collectives, or none.
        train_policy = _dist.reduce_max(0.0 if metrics["no_signal"] else 1.0) > 0
        self._reshard()

        # 2-3. losses and update, epochs x minibatches (without signal: the critic's alone)
        sums = dict.fromkeys(_LOSS_SUMS, 0.0)
        if self.replay is not None and c.moe_aux_loss > 0:
            sums["moe_aux_loss"] = 0.0
        grad_norm, n_updates = 0.0, 0
        if train_policy or self.critic is not None:
            for _ in range(c.epochs):
                perm = torch.randperm(len(samples), generator=self.generator).tolist()
                n_mb = min(c.minibatches, len(samples))
                for m in range(n_mb):
                    mb = perm[m * len(samples) // n_mb : (m + 1) * len(samples) // n_mb]
                    self._losses(mb, samples, old, sums)
                    grad_norm += self._update(train_policy, loss_finite=math.isfinite(sums["loss"]))
                    n_updates += 1

        metrics["policy_updates"] = n_updates if train_policy else 0
        if not train_policy:
            metrics["skipped"] = "no signal: no optimizer step on the policy, its version kept"
            if self.rank == 0:
                log.warning("claw-rl: step skipped: %s", metrics["skipped"])
        if n_updates:
            sums = _dist.reduce_sums(sums)
            metrics.update(
                loss=sums["loss"] / n_updates,
                pg_loss=sums["pg_loss"] / n_updates,
                clip_frac=sums["clip_frac"] / n_updates,
                approx_kl=sums["approx_kl"] / n_updates,
                grad_norm=grad_norm / n_updates,
            )
            if self.reference is not None:
                metrics["kl_ref"] = sums["kl"] / n_updates
            if "moe_aux_loss" in sums:
                metrics["moe_aux_loss"] = sums["moe_aux_loss"] / n_updates
        if self.critic is not None:
            metrics["critic_updates"] = n_updates
            metrics["value_loss"] = sums["value_loss"] / n_updates
            metrics.update(_metrics.values(samples, {k: old.tokens[k] for k in old.own}))
        metrics.update(_metrics.batch(samples, old.n_tokens, time.perf_counter() - t0))
        self.step_count += 1
        if train_policy:
            self.dirty = True  # the next save_policy takes a new version
        self.last_metrics = _metrics.finite(metrics)
        return dict(self.last_metrics)

    def _admit(self, samples: list[Sample], metrics: dict) -> list[Sample]:
        """Refuse samples this learner cannot train on; report (and drop) stale ones."""
        if not samples:
            raise ClawError("step() got no samples")
        for s in samples:
            if s.algo not in self.sample_algos:
                where = " (claw-tree sft-samples)" if self.algo == "sft" else ""
                raise ClawError(
                    f"sample {s.sample_id!r} has algo {s.algo!r}: {_BUILT_FOR.get(s.algo, '?')}; "
                    f"this {self.algo} learner takes {'/'.join(self.sample_algos)} samples{where}"
                )
            if self.critic is not None and s.returns is None:
                raise ClawError(
                    f"sample {s.sample_id!r} has no 'returns': PPO needs value targets "
                    "(claw-tree samples --algo ppo --values FILE)"
                )
        if self.max_staleness is None:
            return samples
        # per session: a group-packed sample holds several rollouts, each judged on its own
        ages = [_metrics.session_ages(s, self.version) for s in samples]
        stale = [[a > self.max_staleness for a in per] for per in ages]
        metrics.update(_metrics.staleness(ages, stale))
        if not self.drop_stale:
            return samples
        metrics["dropped_stale"] = sum(sum(per) for per in stale)
        kept = [
            s if not any(st) else keep_sessions(s, [not x for x in st])
            for s, st in zip(samples, stale, strict=True)
            if not all(st)
        ]
        if not kept:
            raise ClawError(
                f"every session is stale (more than {self.max_staleness} versions behind "
                f"version {self.version}; oldest {metrics['staleness_max']}) and drop_stale is "
                "on: nothing to train on"
            )
        return kept

    @torch.no_grad()
    def _old(self, samples: list[Sample], metrics: dict) -> _Old:
        """Phase 1: log pi_old, IS weights and keep fractions (and old values, reference
        logprobs) of this rank's samples; mismatch, entropy and weight metrics over all ranks."""
        own = _dist.own([len(s) for s in samples])  # balanced by tokens, the same on every rank
        tokens: dict[int, Tokens] = {}
        mm = {"n": 0.0, "abs_sum": 0.0, "abs_max": 0.0, "k1_sum": 0.0, "k3_sum": 0.0, "beyond": 0.0}
        ent_sum = greedy_sum = 0.0
        pos = 0
        tally = self._tally()
        for batch, padding in self._micro_batches([samples[k] for k in own], _shortest(samples)):
            # the routing of an MoE policy: recorded rows (r3), its own choices elsewhere
            hidden, routed = self._hidden(batch, self._recorded(batch), live=True)
            st = token_logprobs(self.policy, hidden, batch)  # (M,) each
            used = routed.used if routed is not None else None  # the experts each token used
            values = self._values(batch, hidden, used) if self.critic else None  # (B, N)
            logp_ref = self._ref_logprobs(batch, used) if self.reference else None  # (M,)
            if padding:
                continue
            if routed is not None and tally is not None:
                assert routed.live is not None
                tally.add(routed.used, routed.live, batch)
            b, i, _ = batch.predictor_index()
            # greedy tokens (T = 0) were drawn from a point mass: off-policy, no ratio to take;
            # they leave the loss (keep 0) and the mismatch metrics, and are counted
            g = st.greedy
            greedy_sum += float(g.sum())
            ent_sum += float(st.entropy[~g].double().sum())
            lp_eng = torch.where(g, st.logprobs, batch.logprobs[b, i])
            s = mismatch_stats(st.logprobs[~g], lp_eng[~g], self.mismatch_threshold)
            for key in mm:
                mm[key] = max(mm[key], s[key]) if key == "abs_max" else mm[key] + s[key]
            per_sample = {
                "logp_old": _split(st.logprobs, batch),
                "lp_eng": _split(lp_eng, batch),
                "greedy": _split(g, batch),
                "kept": _split(st.kept, batch),  # the kept sets, decided here once (_losses)
            }
            if values is not None:
                per_sample["values_old"] = _split(values[b, i], batch)
            if logp_ref is not None:
                per_sample["logp_ref"] = _split(logp_ref, batch)
            for k, sample in enumerate(batch.samples):
                d = {key: parts[k] for key, parts in per_sample.items()}
                is_w, keep = self.correction.weights(
                    d["logp_old"], d.pop("lp_eng"), sample, self.aggregation.kind
                )
                d["keep"] = torch.where(d.pop("greedy"), torch.zeros_like(keep), keep)
                d["is_w"] = is_w
                if routed is not None and self.replay != "off":  # replayed by _losses
                    d["routing"] = routed.used[k, : len(sample)]
                tokens[own[pos + k]] = d
            pos += len(batch.samples)

        abs_max = _dist.reduce_max(mm.pop("abs_max"))
        is_sum = sum(float((o["is_w"] * o["keep"]).double().sum()) for o in tokens.values())
        red = _dist.reduce_sums({**mm, "entropy": ent_sum, "greedy": greedy_sum, "is": is_sum})
        n_tok = max(red["n"], 1.0)
        metrics.update(finish_mismatch({**{k: red[k] for k in mm}, "abs_max": abs_max}))
        metrics["entropy"] = red["entropy"] / n_tok
        metrics["greedy_tokens"] = int(red["greedy"])
        metrics["is_weight_mean"] = red["is"] / n_tok
        if tally is not None:
            metrics.update(tally.finish())

        # each sample's mass in the loss (sum of q over its trainable tokens), and what MIS kept
        q = [self.aggregation.mass(s) for s in samples]
        kept = torch.zeros(len(samples), dtype=torch.float64)
        for k, o in tokens.items():
            kept[k] = float((torch.from_numpy(q[k]) * o["keep"].double().cpu()).sum())
        if self.world > 1 and min(self.config.minibatches, len(samples)) > 1:
            # minibatches re-balance their samples over the ranks (_losses): every rank gets
            # every sample's old tokens (a few floats per trainable token)
            cpu = {k: {key: t.cpu() for key, t in d.items()} for k, d in tokens.items()}
            tokens = {
                k: {key: t.to(self.device) for key, t in d.items()}
                for k, d in _dist.gather_dicts(cpu).items()
            }
        old = _Old(
            tokens=tokens,
            own=own,
            n_tokens=int(n_tok) + metrics["greedy_tokens"],
            mass=np.array([float(x.sum()) for x in q]),
            kept=_dist.all_reduce_sum(kept).numpy(),
        )
        if self.whiten_std_floor is not None:
            self._whiten(samples, q, old, metrics, self.whiten_std_floor)
        uses_advantages = not isinstance(self.objective, WeightedNLL)
        metrics.update(_metrics.signal(samples, q, old.adv_mean, old.adv_scale, uses_advantages))
        if metrics["no_signal"] and self.rank == 0:
            log.warning(
                "claw-rl: NO LEARNING SIGNAL in this update: %s; the policy loss is zero",
                metrics["no_signal_reason"],
            )
        return old

    def _whiten(
        self, samples: list[Sample], q: list, old: _Old, metrics: dict, floor: float
    ) -> None:
        """The advantages' weighted mean and scale over the batch (std floored at ``floor``),
        kept on ``old`` for the losses and reported in ``metrics``."""
        A = torch.cat(
            [
                torch.tensor(s.advantages)[torch.tensor(s.trainable, dtype=torch.bool)]
                for s in samples
            ]
        )
        old.adv_mean, old.adv_scale = losses.whiten(
            A,
            torch.from_numpy(np.concatenate(q)),
            std_floor=floor,
            center=self.whiten_center,
        )
        metrics["adv_whiten_mean"], metrics["adv_whiten_std"] = old.adv_mean, old.adv_scale

    def _losses(self, mb: list[int], samples: list[Sample], old: _Old, sums: dict) -> None:
        """Phase 2: the loss of one minibatch on this rank's share of it, backward."""
        agg = self.aggregation.for_minibatch([samples[k] for k in mb], old.mass[mb], old.kept[mb])
        # this rank's share, balanced by tokens within the minibatch; with one minibatch it is
        # exactly phase 1's (the same split of the same batch), else phase 1 gathered old tokens
        by_index = sorted(mb)
        chosen = {by_index[j] for j in _dist.own([len(samples[k]) for k in by_index])}
        mine = [k for k in mb if k in chosen]
        pos = 0
        shortest = _shortest([samples[k] for k in mb])
        for batch, padding in self._micro_batches([samples[k] for k in mine], shortest):
            ks = [] if padding else mine[pos : pos + len(batch.samples)]
            pos += len(ks)
            # an MoE policy's tokens go to the experts phase 1 fixed for them (R3 / R2)
            replay = self._replayed(batch, [old.tokens[k] for k in ks])
            hidden, routed = self._hidden(batch, replay)
            o: Tokens = {}
            if not padding:
                o = {
                    key: torch.cat([old.tokens[k][key] for k in ks])
                    for key in old.tokens[ks[0]]
                    if key != "routing"
                }
            # every token's kept set (top_k / top_p) as phase 1 decided it, whatever this
            # micro-batch's padding and layout: a near-tie at its edge cannot flip between passes
            kept = o.get("kept")
            lp = token_logprobs(self.policy, hidden, batch, with_entropy=False, kept=kept).logprobs
            if padding:  # same passes as a real micro-batch (FSDP's collectives), zero weight
                o, acc = self._stand_in(batch, lp), dict.fromkeys(sums, 0.0)
            else:
                acc = sums
            b, i, p = batch.predictor_index()
            tok = agg.tok(batch, o["keep"])
            A = (batch.advantages[b, i] - old.adv_mean) / old.adv_scale  # (M,)
            pg_loss, clipped = self.objective(lp, o, A, agg, tok)
            loss = pg_loss
            if self.entropy_coef > 0:
                logq = sampling_log_softmax(
                    self.policy.get_output_embeddings()(hidden[b, p]).float(),
                    batch.temperatures[b, i],
                    batch.top_ps[b, i],
                    batch.top_ks[b, i],
                    batch.input_ids[b, i],
                    kept,
                )
                loss = loss - self.entropy_coef * agg.loss(entropy(logq), tok)
            if self.reference is not None:
                kl = agg.loss(self.reference.kl(lp, o["logp_ref"]), tok)
                loss = loss + self.reference.kl_coef * kl
                acc["kl"] += float(kl.detach())
            if self.critic is not None:
                v = self._values(batch, hidden, replay)[b, i]  # (M,)
                assert batch.returns is not None  # _admit: a critic's samples carry returns
                R = batch.returns[b, i]  # (M,)
                vl = agg.loss(self.critic.loss(v, o["values_old"], R), tok)
                loss = loss + self.critic.vf_coef * vl
                acc["value_loss"] += float(vl.detach())
            if routed is not None and "moe_aux_loss" in acc:
                aux = self._aux_loss(routed, batch)
                loss = loss + self.config.moe_aux_loss * aux
                acc["moe_aux_loss"] += float(aux.detach())
            if not loss.requires_grad:  # no trainable token here: a zero loss on the graph,
                loss = loss + 0.0 * hidden.sum()  # so backward (FSDP's collectives) still runs
            (loss * 0.0 if padding else loss).backward()
            acc["loss"] += float(loss.detach())
            acc["pg_loss"] += float(pg_loss.detach())
            acc["clip_frac"] += float(agg.mean(clipped, tok))
            acc["approx_kl"] += float(agg.mean(losses.approx_kl(lp.detach(), o["logp_old"]), tok))

    def _tally(self) -> _metrics.RoutingTally | None:
        if self.replay is None:
            return None
        return _metrics.RoutingTally(len(self.routers), int(self.routers[0].num_experts))

    def _aux_loss(self, routed: Routed, batch: Batch) -> torch.Tensor:
        """The load-balancing loss of one pass over the batch's real tokens."""
        n = batch.input_ids.shape[1]
        real = (
            torch.arange(n, device=self.device)[None, :]
            < torch.tensor(batch.lengths, device=self.device)[:, None]
        )  # (B, N); padding stays at the end in the model's order too
        r0 = self.routers[0]
        return _moe.load_balancing_loss(routed.state, real, int(r0.num_experts), int(r0.top_k))

    def _stand_in(self, batch: Batch, lp: torch.Tensor) -> Tokens:
        """Old tokens for a padding pass (its loss is multiplied by zero)."""
        ones = torch.ones_like(lp.detach())
        d = {"logp_old": lp.detach(), "is_w": ones, "keep": ones}
        if self.reference is not None:
            d["logp_ref"] = lp.detach()
        if self.critic is not None:
            b, i, _ = batch.predictor_index()
            assert batch.returns is not None
            d["values_old"] = batch.returns[b, i].float()
        return d

    def _update(self, train_policy: bool = True, *, loss_finite: bool = True) -> float:
        """Phase 3: gradients summed over ranks, norm clipped, one AdamW step; the norm.

        ``train_policy`` False (a batch without learning signal): the policy's gradients are
        dropped first, so AdamW skips its parameters entirely (no moment update, no weight
        decay, no step count) and only the critic's are summed, clipped and stepped.

        A non-finite loss (``loss_finite`` False on any rank) or gradient norm is refused before
        anything is applied; non-finite weights after the step (an overflow in AdamW) are
        refused too. Either is a :class:`ClawError` on every rank: the step fails loudly and
        nothing is saved (the learner is not to be used further after the second)."""
        params = self.params()
        policy_params = self.optimizer.param_groups[0]["params"]
        if not train_policy:
            for p in policy_params:
                p.grad = None
            params = params[len(policy_params) :]
        _dist.sum_grads(params)
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm > 0 else float("inf")
        norm = _dist.clip_grads(params, max_norm)  # the same on every rank
        if _dist.reduce_max(0.0 if loss_finite and math.isfinite(norm) else 1.0) > 0:
            self.optimizer.zero_grad(set_to_none=True)
            raise ClawError(
                f"learner step {self.step_count + 1}: non-finite "
                f"{'loss' if not loss_finite else 'gradient'} (gradient norm {norm}); the update "
                "is refused, nothing is applied or saved (check lr and the samples' advantages)"
            )
        warmup, decay = self.config.warmup_steps, self.config.decay_steps
        if warmup or decay:
            # the k-th optimizer step (1-based) runs at lr * min(1, k / warmup) * max(0, (decay -
            # k + 1) / decay); k comes from AdamW's own per-parameter step count of the policy's
            # first parameter, so a resumed learner continues the schedule and a step without
            # signal (no policy update) does not advance it (the critic steps at its factor)
            state = self.optimizer.state.get(policy_params[0], {}) if policy_params else {}
            k = int(state.get("step", 0)) + 1
            factor = min(1.0, k / warmup) if warmup else 1.0
            if decay:
                factor *= max(0.0, (decay - k + 1) / decay)
            for group in self.optimizer.param_groups:
                group["lr"] = group["base_lr"] * factor
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        local = [p.detach().to_local() if _dist.is_sharded(p) else p.detach() for p in params]
        finite = (
            bool(torch.stack([torch.isfinite(t).all() for t in local]).all()) if local else True
        )
        if _dist.reduce_max(0.0 if finite else 1.0) > 0:
            raise ClawError(
                f"learner step {self.step_count + 1}: the AdamW step made non-finite weights (lr "
                f"{self.optimizer.param_groups[0]['lr']}); refused: nothing is saved"
            )
        return norm


# -- helpers ----------------------------------------------------------------------------------


def _trainable(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def _shortest(samples: Sequence[Sample]) -> Sample:
    """The cheapest sample to forward as an FSDP padding pass (its loss counts zero)."""
    return min(samples, key=len)


def _split(t: torch.Tensor, batch: Batch) -> list[torch.Tensor]:
    """Per-token values (M,) cut into one tensor per sample of the batch."""
    return list(torch.split(t, batch.trainable.sum(1).tolist()))


def _checks(config: GRPOConfig | PPOConfig) -> dict:
    """The mismatch and staleness settings of an RL config, as Learner arguments."""
    return {
        "mismatch_threshold": config.mismatch_threshold,
        "max_staleness": config.max_staleness,
        "drop_stale": config.drop_stale,
    }


def _replay_mode(option: str, moe: bool) -> str | None:
    """The routing replay of a step (``r3``, ``r2``, ``off``), None for a dense model."""
    if not moe:
        return None
    return "r3" if option == "auto" else option


def _side_replays(
    replay: str | None,
    routers: list[torch.nn.Module],
    reference: Reference | None,
    critic: Critic | None,
) -> tuple[bool, bool]:
    """Whether the reference and a separate critic backbone replay the experts of the policy's
    pass: when the policy replays (r3 / r2) and they are MoE models of its layout; an MoE model
    of another layout routes live (a warning says so, once)."""
    if replay not in ("r3", "r2"):
        return False, False
    ref = reference is not None and replays_policy_routing(
        reference.model, routers, "reference model"
    )
    backbone = critic.backbone if critic is not None else None
    crit = backbone is not None and replays_policy_routing(backbone, routers, "critic model")
    return ref, crit


def _correction(config: GRPOConfig | PPOConfig) -> Correction:
    return Correction(config.is_correction, config.is_cap, config.is_min, config.mis_seq_tol)


def _load(
    config: TrainConfig,
    model_dir: str | Path,
    device: str | None,
    origin_dir: str | Path | None,
) -> tuple[torch.nn.Module, Any, torch.dtype, torch.device, Path]:
    """The policy on its device, seeded: ``(policy, adapter, dtype, device, origin_dir)``; the
    origin (the run's initial model: default reference and critic backbone) defaults to
    ``model_dir``. With ``config.lora_rank`` the policy carries a LoRA adapter (new, or
    ``model_dir``'s when it is an adapter directory) and ``adapter`` is its ``PeftModel``."""
    dev = torch.device(device) if device else _default_device(_dist.world()[1])
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dtype = _DTYPES[config.dtype]
    torch.manual_seed(config.seed)
    origin = Path(origin_dir) if origin_dir else Path(model_dir)
    if not _lora.is_adapter(model_dir):
        # absolute: a new adapter records it as its base (base_model_name_or_path)
        policy = load_policy(Path(model_dir).resolve(), dtype).to(dev)
        if not config.lora_rank:
            return policy, None, dtype, dev, origin
        adapter = _lora.attach(policy, config)
    elif not config.lora_rank:
        raise ClawError(
            f"{model_dir} is a LoRA adapter directory: train it with lora_rank > 0 "
            "(--lora-rank, its rank), or merge it into its base model first"
        )
    else:
        base = load_policy(_lora.base_of(model_dir), dtype).to(dev)
        adapter = _lora.load(model_dir, base)
    return adapter.get_base_model().to(dev), adapter, dtype, dev, origin


__all__ = ["Learner", "load_policy"]
