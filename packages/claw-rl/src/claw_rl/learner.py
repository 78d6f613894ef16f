"""GRPO and PPO learners over tree-packed samples.

    learner = GRPOLearner(GRPOConfig(lr=1e-5), "runs/tiny")
    metrics = learner.step(samples)          # list of claw.sample/v1 dicts -> metrics dict
    policy = learner.save("runs/p/v1")       # HF dir + claw.policy/v1 dict (version + 1)
    learner.save_checkpoint("runs/ckpt")     # ... GRPOLearner.resume("runs/ckpt")

One step: (1) drop or report stale samples, (2) recompute pi_old for the recorded tokens and
compare with the engine's logprobs (mismatch report), (3) importance weights (TIS / MIS),
(4) ``epochs`` x ``minibatches`` optimizer steps on the clipped loss. Under torchrun each rank
forwards its share of every minibatch and the gradients are summed; the model is replicated
(``parallelism="ddp"``) or sharded with FSDP2 (``"fsdp"``), see :mod:`claw_rl._dist`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np
import torch

from claw_rl import _dist, losses
from claw_rl._learner_io import LearnerIO
from claw_rl.config import GRPOConfig, PPOConfig
from claw_rl.consistency import (
    finish_mismatch,
    mis_sequence_keep,
    mis_token_mask,
    mismatch_stats,
    path_shares,
    tis_weights,
)
from claw_rl.errors import ClawError
from claw_rl.forward import backbone_hidden, entropy, sampling_log_softmax, token_logprobs
from claw_rl.packing import Batch, leaf_counts, pack, path_matrix, to_device
from claw_rl.records import Sample, as_samples

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_policy(model_dir: str | Path, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype=dtype, attn_implementation="sdpa"
        )
    except (OSError, ValueError) as exc:
        raise ClawError(f"{model_dir}: cannot load an HF causal LM ({exc})") from exc
    model.eval()  # dropout off: pi_old and pi_theta must be the same function at epoch 1
    return model


def _default_device(world: int) -> str:
    """cuda (cuda:LOCAL_RANK under torchrun) when a GPU is visible, else cpu."""
    import os

    if not torch.cuda.is_available():
        return "cpu"
    return f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if world > 1 else "cuda"


@attrs.frozen
class _Aggregator:
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

    def tok(self, batch: Batch, keep: torch.Tensor) -> dict:
        b, i, _ = batch.predictor_index()
        c = batch.leaf_counts[b, i]
        return {"q": batch.loss_weights[b, i] if self.kind == "weights" else c, "c": c, "m": keep}

    def loss(self, lt: torch.Tensor, tok: dict, masked: bool = False) -> torch.Tensor:
        if masked:
            lt = lt * tok["m"]
        if self.kind == "constant":
            return losses.constant_sum(lt, tok["c"], self.n_traj, self.constant_len)
        denom = self.kept if masked else self.full
        return losses.weighted_sum(lt, tok["q"]) * (1.0 / denom if denom > 0 else 0.0)

    def mean(self, x: torch.Tensor, tok: dict) -> torch.Tensor:
        return losses.weighted_sum(x.to(tok["q"].dtype), tok["q"]) * (
            1.0 / self.full if self.full > 0 else 0.0
        )


class _Learner(LearnerIO):
    """Shared machinery; see :class:`GRPOLearner` and :class:`PPOLearner`."""

    algo = ""

    def __init__(
        self,
        config: GRPOConfig | PPOConfig,
        model_dir: str | Path,
        *,
        version: int = 0,
        device: str | None = None,
        origin_dir: str | Path | None = None,
    ) -> None:
        self.config = config
        self.model_dir = Path(model_dir)
        self.origin_dir = Path(origin_dir) if origin_dir else self.model_dir
        self.rank, self.world = _dist.world()
        self.device = torch.device(device or _default_device(self.world))
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.fsdp = config.parallelism == "fsdp" and self.world > 1
        self.dtype = _DTYPES[config.dtype]
        torch.manual_seed(config.seed)
        self.model = load_policy(self.model_dir, self.dtype).to(self.device)
        self.version = version
        self.step_count = 0
        self.generator = torch.Generator().manual_seed(config.seed)
        self.last_metrics: dict = {}
        self._dirty = False
        self._init_extra()
        if self.fsdp:
            for module in self._large_modules():
                _dist.fully_shard_model(module)
        _dist.broadcast_params(self._params())
        self.optimizer = torch.optim.AdamW(
            self._param_groups(),
            betas=(config.adam_beta1, config.adam_beta2),
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
        )

    # -- hooks for subclasses -------------------------------------------------------------
    def _init_extra(self) -> None: ...

    def _param_groups(self) -> list[dict]:
        return [
            {
                "params": [p for p in self.model.parameters() if p.requires_grad],
                "lr": self.config.lr,
            }
        ]

    def _params(self) -> list[torch.nn.Parameter]:
        return [p for g in self._param_groups() for p in g["params"]]

    def _large_modules(self) -> list[torch.nn.Module]:
        """The transformers FSDP shards (policy, reference, critic model)."""
        return [self.model]

    def _trained_modules(self) -> dict[str, torch.nn.Module]:
        """Every module whose parameters the optimizer updates, by a stable name."""
        return {"policy": self.model}

    def _check_samples(self, samples: list[Sample]) -> None: ...

    def _pad_old(self, batch: Batch, st) -> dict:
        """Stand-ins for a padding pass's old values (its loss is multiplied by zero)."""
        ones = torch.ones_like(st.logprobs.detach())
        d = {"logp_old": st.logprobs.detach(), "is_w": ones, "keep": ones}
        if getattr(self.config, "kl_coef", 0.0) > 0:
            d["logp_ref"] = st.logprobs.detach()
        return d

    def _old_extra(self, batch: Batch, hidden: torch.Tensor) -> list[dict]:
        return [{} for _ in batch.samples]

    def _extra_loss(
        self, batch: Batch, hidden: torch.Tensor, old: dict, agg, acc: dict
    ) -> torch.Tensor:
        return hidden.new_zeros(())

    # -- forward helpers --------------------------------------------------------------------
    def _micro(self, samples: Sequence[Sample]):
        mb = self.config.micro_batch_size
        for lo in range(0, len(samples), mb):
            yield to_device(pack(samples[lo : lo + mb]), self.device)

    @torch.no_grad()
    def logprobs(self, samples: Sequence[Sample | dict]) -> list[list[float]]:
        """Learner logprob of each sample's trainable tokens, aligned with its tokens (0 elsewhere)."""
        samples = as_samples(samples)
        out: list[list[float]] = []
        for batch in self._micro(samples):
            hidden = backbone_hidden(self.model, batch)
            lp = token_logprobs(self.model, hidden, batch, with_entropy=False).logprobs
            for k, part in enumerate(self._split(lp, batch)):
                row = [0.0] * batch.lengths[k]
                for j, v in zip(
                    batch.trainable[k].nonzero().flatten().tolist(), part.tolist(), strict=True
                ):
                    row[j] = v
                out.append(row)
        self._reshard()
        return out

    def _reshard(self) -> None:
        """Free the gathered parameters an FSDP forward without backward leaves behind (the root
        keeps its own gathered after forward, expecting a backward)."""
        if self.fsdp:
            for module in self._large_modules():
                module.reshard()

    def _micro_step(self, samples: Sequence[Sample], pad_with: Sample):
        """``(batch, is_padding)`` per micro-batch of this rank's samples.

        Under FSDP each forward pass gathers parameters from every rank, so all ranks run as many
        passes as the busiest one; the extra ones run on ``pad_with`` and count zero.
        """
        mb = self.config.micro_batch_size
        parts = [samples[lo : lo + mb] for lo in range(0, len(samples), mb)]
        n = len(parts)
        if self.fsdp:
            n = int(_dist.all_reduce_max(torch.tensor([n], dtype=torch.int64))[0])
        for k in range(n):
            if k < len(parts):
                yield to_device(pack(parts[k]), self.device), False
            else:
                yield to_device(pack([pad_with]), self.device), True

    @staticmethod
    def _split(t: torch.Tensor, batch: Batch) -> list[torch.Tensor]:
        return list(torch.split(t, batch.trainable.sum(1).tolist()))

    # -- the step ---------------------------------------------------------------------------
    def _staleness(self, samples: list[Sample], metrics: dict) -> list[Sample]:
        ages = []
        for s in samples:
            vs = [
                v
                for v, t in zip(s.policy_versions or (), s.trainable, strict=False)
                if t and v >= 0
            ]
            ages.append(self.version - min(vs) if vs else 0)
        stale = [a > self.config.max_staleness for a in ages]
        metrics.update(
            staleness_max=max(ages),
            staleness_mean=sum(ages) / len(ages),
            stale_samples=sum(stale),
            dropped_stale=0,
        )
        if self.config.drop_stale:
            metrics["dropped_stale"] = sum(stale)
            samples = [s for s, st in zip(samples, stale, strict=True) if not st]
        return samples

    def _is_weights(
        self, lp_old: torch.Tensor, lp_eng: torch.Tensor, sample: Sample
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(is_w, keep)`` per trainable token: the TIS weight (1 unless tis) and the MIS keep
        fraction (1 unless mis_*); masked tokens leave the loss's denominator, weighted ones do not."""
        c = self.config
        ones = torch.ones_like(lp_old)
        if c.is_correction == "tis":
            return tis_weights(lp_old, lp_eng, c.is_cap), ones
        if c.is_correction == "mis_token":
            return ones, mis_token_mask(lp_old, lp_eng, c.is_min, c.is_cap)
        if c.is_correction == "mis_sequence":
            tr = torch.tensor(sample.trainable, dtype=torch.bool)
            log_rho = torch.zeros(len(sample), dtype=torch.float64)
            log_rho[tr] = (lp_old - lp_eng).double().cpu()
            paths = torch.from_numpy(path_matrix(sample.parent))
            # a shared token's weight is split over its paths as the aggregator's flat batch does:
            # path counts for token_mean / constant; claw-tree's own split for the loss weights
            weighted = getattr(c, "loss_agg", "weights") == "weights"
            split = (sample.tags or {}).get("path_weighting")
            kind = "inverse_length" if weighted and split in ("rollout", "path") else "equal"
            keep = mis_sequence_keep(
                log_rho, paths, tr, c.mis_seq_tol, path_shares(paths, tr, kind)
            )
            return ones, keep[tr].to(lp_old)
        return ones, ones

    def step(self, samples: Sequence[Sample | dict]) -> dict:
        """One learner update on a batch of samples (every rank passes the same global batch)."""
        t0 = time.perf_counter()
        c = self.config
        samples = as_samples(samples)
        if not samples:
            raise ClawError("step() got no samples")
        self._check_samples(samples)
        metrics: dict = {"step": self.step_count + 1, "version": self.version}
        samples = self._staleness(samples, metrics)
        if not samples:
            raise ClawError("every sample is stale and drop_stale is on: nothing to train on")
        own = [k for k in range(len(samples)) if k % self.world == self.rank]

        # (2) pi_old, pi_ref, old values; mismatch against the engine; (3) IS weights
        old: dict[int, dict] = {}
        mm = {"n": 0.0, "abs_sum": 0.0, "abs_max": 0.0, "k1_sum": 0.0, "k3_sum": 0.0, "beyond": 0.0}
        ent_sum = greedy_sum = 0.0
        with torch.no_grad():
            own_samples = [samples[k] for k in own]
            pos = 0
            for batch, padding in self._micro_step(own_samples, pad_with=samples[0]):
                hidden = backbone_hidden(self.model, batch)
                st = token_logprobs(self.model, hidden, batch)
                extra = self._old_extra(batch, hidden)
                ref = self._ref_logprobs(batch)
                if padding:
                    continue
                b, i, _ = batch.predictor_index()
                # greedy tokens (T = 0) were drawn from a point mass: off-policy, no ratio to take;
                # they leave the loss (keep 0) and the mismatch metrics, and are counted
                g = st.greedy
                greedy_sum += float(g.sum())
                ent_sum += float(st.entropy[~g].double().sum())
                lp_eng_all = torch.where(g, st.logprobs, batch.logprobs[b, i])
                s = mismatch_stats(st.logprobs[~g], lp_eng_all[~g], c.mismatch_threshold)
                for key in mm:
                    mm[key] = max(mm[key], s[key]) if key == "abs_max" else mm[key] + s[key]
                for k, (lp, lpe, gk) in enumerate(
                    zip(
                        self._split(st.logprobs, batch),
                        self._split(lp_eng_all, batch),
                        self._split(g, batch),
                        strict=True,
                    )
                ):
                    is_w, keep = self._is_weights(lp, lpe, batch.samples[k])
                    keep = torch.where(gk, torch.zeros_like(keep), keep)
                    d = {"logp_old": lp, "is_w": is_w, "keep": keep, **extra[k]}
                    if ref is not None:
                        d["logp_ref"] = self._split(ref, batch)[k]
                    old[own[pos + k]] = d
                pos += len(batch.samples)
        red = _dist.all_reduce_sum(
            torch.tensor(
                [
                    mm["n"],
                    mm["abs_sum"],
                    mm["k1_sum"],
                    mm["k3_sum"],
                    mm["beyond"],
                    ent_sum,
                    greedy_sum,
                ],
                dtype=torch.float64,
            )
        )
        mx = _dist.all_reduce_max(torch.tensor([mm["abs_max"]], dtype=torch.float64))
        mm = dict(
            zip(["n", "abs_sum", "k1_sum", "k3_sum", "beyond"], red[:5].tolist(), strict=True)
        )
        mm["abs_max"] = float(mx[0])
        metrics.update(finish_mismatch(mm))
        n_tok = max(mm["n"], 1.0)
        metrics["entropy"] = float(red[5]) / n_tok
        metrics["greedy_tokens"] = int(red[6])
        is_sum = sum(float((o["is_w"] * o["keep"]).double().sum()) for o in old.values())
        metrics["is_weight_mean"] = (
            float(_dist.all_reduce_sum(torch.tensor([is_sum], dtype=torch.float64))[0]) / n_tok
        )
        # each sample's mass in the loss (sum of q over its trainable tokens), and what MIS kept of it
        q = [self._token_mass(s) for s in samples]
        self._mass = np.array([float(x.sum()) for x in q])
        kept = torch.zeros(len(samples), dtype=torch.float64)
        for k, o in old.items():
            kept[k] = float((torch.from_numpy(q[k]) * o["keep"].double().cpu()).sum())
        self._kept = _dist.all_reduce_sum(kept).numpy()
        self._adv_norm = (0.0, 1.0)
        if getattr(c, "whiten_advantages", False):
            self._adv_norm = losses.whiten(
                torch.cat(
                    [
                        torch.tensor(s.advantages)[torch.tensor(s.trainable, dtype=torch.bool)]
                        for s in samples
                    ]
                ),
                torch.from_numpy(np.concatenate(q)),
                std_floor=float(getattr(c, "whiten_std_floor", 0.0)),
            )
            metrics["adv_whiten_mean"], metrics["adv_whiten_std"] = self._adv_norm

        # (4) epochs x minibatches
        acc = {
            k: 0.0
            for k in (
                "loss",
                "pg_loss",
                "kl",
                "value_loss",
                "clip_frac",
                "approx_kl",
                "grad_norm",
                "opt_steps",
            )
        }
        self._reshard()
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        for _ in range(c.epochs):
            perm = torch.randperm(len(samples), generator=self.generator).tolist()
            n_mb = min(c.minibatches, len(samples))
            for m in range(n_mb):
                mb = perm[m * len(samples) // n_mb : (m + 1) * len(samples) // n_mb]
                self._minibatch(
                    mb, [k for k in mb if k % self.world == self.rank], samples, old, acc
                )
                gn = self._optimizer_step(params)
                acc["grad_norm"] += gn
                acc["opt_steps"] += 1
        red = _dist.all_reduce_sum(
            torch.tensor(
                [acc[k] for k in ("loss", "pg_loss", "kl", "value_loss", "clip_frac", "approx_kl")],
                dtype=torch.float64,
            )
        ).tolist()
        n_steps = max(acc["opt_steps"], 1)
        metrics.update(
            loss=red[0] / n_steps,
            pg_loss=red[1] / n_steps,
            clip_frac=red[4] / n_steps,
            approx_kl=red[5] / n_steps,
            grad_norm=acc["grad_norm"] / n_steps,
        )
        if getattr(c, "kl_coef", 0.0) > 0:
            metrics["kl_ref"] = red[2] / n_steps
        if self.algo == "ppo":
            metrics["value_loss"] = red[3] / n_steps
        self._extra_metrics(samples, old, metrics)
        packed = sum(len(s) for s in samples)
        flat = sum(float(leaf_counts(s.parent).sum()) for s in samples)
        adv = torch.tensor(
            [a for s in samples for a, t in zip(s.advantages, s.trainable, strict=True) if t]
        )
        wall = time.perf_counter() - t0
        metrics.update(
            samples=len(samples),
            tokens=packed,
            trainable_tokens=int(n_tok) + metrics["greedy_tokens"],
            dedup_factor=flat / max(packed, 1),
            tokens_per_s=packed / wall,
            step_time_s=wall,
            adv_mean=float(adv.mean()) if adv.numel() else 0.0,
            zero_adv_frac=float((adv == 0).float().mean()) if adv.numel() else 0.0,
        )
        self.step_count += 1
        self._dirty = True
        self.last_metrics = {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in metrics.items()
        }
        return dict(self.last_metrics)

    def _ref_logprobs(self, batch: Batch) -> torch.Tensor | None:
        return None

    def _extra_metrics(self, samples: list[Sample], old: dict, metrics: dict) -> None: ...

    def _token_mass(self, sample: Sample) -> np.ndarray:
        """q per trainable token: its mass in the loss, the loss weight for loss_agg=weights and the
        number of paths through it (its copies in the flat batch) otherwise."""
        tr = np.asarray(sample.trainable, dtype=bool)
        if getattr(self.config, "loss_agg", "weights") == "weights":
            return np.asarray(sample.loss_weights, dtype=np.float64)[tr]
        return leaf_counts(sample.parent)[tr]

    def _aggregator(self, mb: list[int], samples: list[Sample]) -> _Aggregator:
        """Aggregation of per-token losses, normalised over the whole minibatch (all ranks)."""
        c = self.config
        kind = getattr(c, "loss_agg", "weights")
        n_traj = 0.0
        if kind == "constant":
            n_traj = sum(
                float(leaf_counts(samples[k].parent)[np.asarray(samples[k].parent) == -1].sum())
                for k in mb
            )
        return _Aggregator(
            kind=kind,
            full=float(self._mass[mb].sum()),
            kept=float(self._kept[mb].sum()),
            n_traj=max(n_traj, 1.0),
            constant_len=float(getattr(c, "constant_len", 1)),
        )

    def _minibatch(
        self, mb: list[int], mine: list[int], samples: list[Sample], old: dict, acc: dict
    ) -> None:
        c = self.config
        agg = self._aggregator(mb, samples)
        mb_samples = [samples[k] for k in mb]
        mean_A, std_A = self._adv_norm
        mine_samples = [samples[k] for k in mine]
        pos = 0
        real_acc = acc
        for batch, padding in self._micro_step(mine_samples, pad_with=mb_samples[0]):
            hidden = backbone_hidden(self.model, batch)
            st = token_logprobs(self.model, hidden, batch, with_entropy=False)
            if padding:  # same passes as a real micro-batch (FSDP's collectives), zero weight
                o, acc = self._pad_old(batch, st), dict.fromkeys(real_acc, 0.0)
            else:
                ks = mine[pos : pos + len(batch.samples)]
                pos += len(batch.samples)
                o, acc = {key: torch.cat([old[k][key] for k in ks]) for key in old[ks[0]]}, real_acc
            b, i, p = batch.predictor_index()
            tok = agg.tok(batch, o["keep"])
            A = (batch.advantages[b, i] - mean_A) / std_A
            lp = st.logprobs
            pg, clipped = losses.ppo_clip_loss(
                lp, o["logp_old"], A, c.clip_eps_low, c.clip_eps_high
            )
            pg_loss = agg.loss(pg * o["is_w"], tok, masked=True)
            loss = pg_loss
            if c.entropy_coef > 0:
                logq = sampling_log_softmax(
                    self.model.get_output_embeddings()(hidden[b, p]).float(),
                    batch.temperatures[b, i],
                    batch.top_ps[b, i],
                    batch.top_ks[b, i],
                    batch.input_ids[b, i],
                )
                loss = loss - c.entropy_coef * agg.loss(entropy(logq), tok)
            if "logp_ref" in o:
                kl_fn = losses.kl_k3_loss if c.kl_estimator == "k3" else losses.kl_k2_loss
                kl = agg.loss(kl_fn(lp, o["logp_ref"]), tok)
                loss = loss + c.kl_coef * kl
                acc["kl"] += float(kl.detach())
            loss = loss + self._extra_loss(batch, hidden, o, agg, acc)
            (loss * 0.0 if padding else loss).backward()
            acc["loss"] += float(loss.detach())
            acc["pg_loss"] += float(pg_loss.detach())
            acc["clip_frac"] += float(agg.mean(clipped, tok))
            acc["approx_kl"] += float(agg.mean(losses.approx_kl(lp.detach(), o["logp_old"]), tok))

    def _optimizer_step(self, params: list[torch.nn.Parameter]) -> float:
        _dist.sum_grads(params)
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm > 0 else float("inf")
        gn = _dist.clip_grads(params, max_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return gn


class GRPOLearner(_Learner):
    """Critic-free learner (GRPO and its relatives: the samples' advantages are used as given)."""

    algo = "grpo"

    def __init__(self, config: GRPOConfig, model_dir: str | Path, **kw) -> None:
        if not isinstance(config, GRPOConfig):
            raise ClawError(f"GRPOLearner needs a GRPOConfig, got {type(config).__name__}")
        super().__init__(config, model_dir, **kw)

    def _init_extra(self) -> None:
        self.ref_model = None
        if self.config.kl_coef > 0:
            self.ref_model = load_policy(self.config.ref_model or self.origin_dir, self.dtype).to(
                self.device
            )
            self.ref_model.requires_grad_(False)

    def _large_modules(self) -> list[torch.nn.Module]:
        return [self.model, *([self.ref_model] if self.ref_model is not None else [])]

    def _ref_logprobs(self, batch: Batch) -> torch.Tensor | None:
        if self.ref_model is None:
            return None
        hidden = backbone_hidden(self.ref_model, batch)
        return token_logprobs(self.ref_model, hidden, batch, with_entropy=False).logprobs

    def _check_samples(self, samples: list[Sample]) -> None:
        for s in samples:
            if s.algo == "ppo":
                raise ClawError(
                    f"sample {s.sample_id!r} was built for ppo (critic advantages); "
                    "train it with PPOLearner / --algo ppo"
                )


__all__ = ["GRPOLearner", "load_policy"]
