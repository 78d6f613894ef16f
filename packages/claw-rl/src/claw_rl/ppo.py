"""PPO with a critic on tree-packed samples: value head on the policy or a separate model."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from claw_rl import _dist, critic, losses
from claw_rl.config import PPOConfig
from claw_rl.errors import ClawError
from claw_rl.forward import backbone_hidden, values_per_token
from claw_rl.packing import Batch
from claw_rl.records import Sample, as_samples

if TYPE_CHECKING:
    from collections.abc import Sequence

from claw_rl.learner import _Learner


class PPOLearner(_Learner):
    """PPO: clipped policy loss on the samples' advantages, clipped value loss on their returns.

    ``values(samples)`` gives the critic's V(s_i) per packed token for claw-tree's tree GAE
    (V(s_i) = value of the prefix before token i, read from row ``parent[i]``; 0 for roots).
    The critic is saved in ``<policy dir>/critic/`` and loaded from there when present.
    """

    algo = "ppo"

    def __init__(self, config: PPOConfig, model_dir: str | Path, **kw) -> None:
        if not isinstance(config, PPOConfig):
            raise ClawError(f"PPOLearner needs a PPOConfig, got {type(config).__name__}")
        super().__init__(config, model_dir, **kw)

    def _init_extra(self) -> None:
        c = self.config
        saved = critic.critic_kind(self.model_dir)
        if saved is not None and saved != c.critic:
            raise ClawError(
                f"{self.model_dir}/critic holds a critic of kind {saved!r} but the config "
                f"asks for critic={c.critic!r}"
            )
        critic_dir = self.model_dir / "critic"
        self.critic_model = None
        if c.critic == "model":
            src = critic_dir if saved else (c.critic_model or self.origin_dir)
            self.critic_model = critic.load_backbone(src, self.dtype).to(self.device)
            self.critic_model.eval()
            hidden = self.critic_model.config.hidden_size
        else:
            hidden = self.model.config.hidden_size
        self.value_head = critic.ValueHead(hidden, self.dtype).to(self.device)
        if saved:
            critic.load_head(self.value_head, critic_dir)

    def _critic_modules(self) -> list[torch.nn.Module]:
        return [m for m in (self.critic_model, self.value_head) if m is not None]

    def _large_modules(self) -> list[torch.nn.Module]:
        return [self.model, *([self.critic_model] if self.critic_model is not None else [])]

    def _trained_modules(self) -> dict[str, torch.nn.Module]:
        critic_model = {"critic_model": self.critic_model} if self.critic_model is not None else {}
        return {"policy": self.model, **critic_model, "value_head": self.value_head}

    def _pad_old(self, batch: Batch, st) -> dict:
        b, i, _ = batch.predictor_index()
        return {**super()._pad_old(batch, st), "values_old": batch.returns[b, i].float()}

    def _param_groups(self) -> list[dict]:
        critic_params = [
            p for m in self._critic_modules() for p in m.parameters() if p.requires_grad
        ]
        return [*super()._param_groups(), {"params": critic_params, "lr": self.config.critic_lr}]

    def _save_critic(self, out: Path, states: dict) -> None:
        if self.critic_model is not None:
            self.critic_model.save_pretrained(
                out / "critic", safe_serialization=True, state_dict=states.get("critic_model")
            )
        critic.save_head(self.value_head, out / "critic")

    def _check_samples(self, samples: list[Sample]) -> None:
        for s in samples:
            if s.returns is None:
                raise ClawError(
                    f"sample {s.sample_id!r} has no 'returns': PPO needs value targets "
                    "(claw-tree samples --algo ppo --values FILE)"
                )

    def _values(self, batch: Batch, hidden: torch.Tensor) -> torch.Tensor:
        """(B, N) values; the policy's hidden states for critic=head, the critic's otherwise."""
        if self.critic_model is not None:
            hidden = backbone_hidden(self.critic_model, batch)
        return values_per_token(self.value_head, hidden, batch)

    def _old_extra(self, batch: Batch, hidden: torch.Tensor) -> list[dict]:
        b, i, _ = batch.predictor_index()
        v = self._values(batch, hidden)[b, i]
        return [{"values_old": part} for part in self._split(v, batch)]

    def _extra_loss(
        self, batch: Batch, hidden: torch.Tensor, old: dict, agg, acc: dict
    ) -> torch.Tensor:
        c = self.config
        b, i, _ = batch.predictor_index()
        v = self._values(batch, hidden)[b, i]
        R = batch.returns[b, i]
        tok = agg.tok(batch, old["keep"])
        vl = agg.loss(
            losses.value_loss(v, old["values_old"], R, c.value_clip if c.value_clip > 0 else None),
            tok,
        )
        acc["value_loss"] += float(vl.detach())
        return c.vf_coef * vl

    def _extra_metrics(self, samples: list[Sample], old: dict, metrics: dict) -> None:
        # explained variance of the old values against the returns, over every trainable token
        own = sorted(old)
        R = (
            torch.cat(
                [
                    torch.tensor(
                        [
                            r
                            for r, t in zip(samples[k].returns, samples[k].trainable, strict=True)
                            if t
                        ],
                        dtype=torch.float64,
                    )
                    for k in own
                ]
            )
            if own
            else torch.zeros(0, dtype=torch.float64)
        )
        v = (
            torch.cat([old[k]["values_old"].double().cpu() for k in own])
            if own
            else torch.zeros(0, dtype=torch.float64)
        )
        s = _dist.all_reduce_sum(
            torch.stack(
                [
                    torch.tensor(float(R.numel()), dtype=torch.float64),
                    R.sum(),
                    (R * R).sum(),
                    (R - v).sum(),
                    ((R - v) ** 2).sum(),
                ]
            )
        )
        n, sR, sR2, sD, sD2 = s.tolist()
        var_R = sR2 / max(n, 1) - (sR / max(n, 1)) ** 2
        var_D = sD2 / max(n, 1) - (sD / max(n, 1)) ** 2
        metrics["explained_variance"] = (
            1.0 - var_D / var_R if n > 1 and var_R > 1e-12 else float("nan")
        )
        metrics["value_mean"] = float(v.mean()) if v.numel() else 0.0
        metrics["return_mean"] = sR / max(n, 1)

    @torch.no_grad()
    def values(self, samples: Sequence[Sample | dict]) -> list[dict]:
        """``{"sample_id", "values"}`` per sample: V(s_i) for every packed token (claw-tree's GAE)."""
        samples = as_samples(samples)
        out = []
        for batch in self._micro(samples):
            hidden = backbone_hidden(self.model, batch) if self.critic_model is None else None
            v = self._values(batch, hidden)
            for k, s in enumerate(batch.samples):
                out.append({"sample_id": s.sample_id, "values": v[k, : len(s)].tolist()})
        self._reshard()
        return out
