"""The PPO critic: a value head on the policy's backbone, or a separate backbone with its own
head. Both live in ``<policy dir>/critic/`` next to a saved policy (a subdirectory, so HF and
vLLM loaders of the policy never see them):

* ``critic/value_head.safetensors`` - the linear head (both kinds);
* ``critic/config.json`` + ``critic/model.safetensors`` - the separate backbone (kind ``model``).
"""

from __future__ import annotations

from pathlib import Path

import attrs
import torch
from safetensors.torch import load_file, save_file

from claw_rl import losses
from claw_rl.errors import CheckpointError, ClawError
from claw_rl.forward import backbone_hidden, moe_hidden, values_per_token
from claw_rl.packing import Batch

HEAD_FILE = "value_head.safetensors"


class ValueHead(torch.nn.Module):
    """v = w . h + b, zero-initialised so a fresh critic predicts 0 everywhere."""

    def __init__(self, hidden_size: int, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(hidden_size, 1, dtype=dtype)
        torch.nn.init.zeros_(self.linear.weight)
        torch.nn.init.zeros_(self.linear.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # (B, N, H) -> (B, N, 1)
        return self.linear(h.to(self.linear.weight.dtype))


def critic_kind(policy_dir: str | Path) -> str | None:
    """``head``, ``model`` or None (no critic saved) for a policy directory."""
    d = Path(policy_dir) / "critic"
    if (d / "config.json").exists():
        return "model"
    if (d / HEAD_FILE).exists():
        return "head"
    return None


def load_head(head: ValueHead, critic_dir: Path) -> None:
    path = critic_dir / HEAD_FILE
    try:
        state = load_file(str(path))
    except (OSError, Exception) as exc:  # safetensors raises its own error types
        raise CheckpointError(f"{path}: cannot load value head ({exc})") from exc
    try:
        head.load_state_dict(state)
    except RuntimeError as exc:
        raise CheckpointError(f"{path}: value head does not fit this model ({exc})") from exc


def save_head(head: ValueHead, critic_dir: Path) -> None:
    critic_dir.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.detach().contiguous() for k, v in head.state_dict().items()},
        str(critic_dir / HEAD_FILE),
    )


def load_backbone(model_dir: str | Path, dtype: torch.dtype) -> torch.nn.Module:
    """The transformer without its LM head (``AutoModel``), for a separate critic."""
    from transformers import AutoModel

    try:
        return AutoModel.from_pretrained(str(model_dir), dtype=dtype, attn_implementation="sdpa")
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{model_dir}: cannot load a critic backbone ({exc})") from exc


@attrs.define(eq=False)
class Critic:
    """The learner's critic part: a value head on the policy's hidden states (``backbone`` None)
    or on a separate backbone, trained at ``lr`` with ``vf_coef`` times the clipped value loss
    (:func:`claw_rl.losses.value_loss`, clip range ``value_clip``; 0 = unclipped)."""

    head: ValueHead
    backbone: torch.nn.Module | None
    lr: float
    vf_coef: float = 0.5
    value_clip: float = 0.2

    @classmethod
    def load(
        cls,
        kind: str,
        policy_dir: Path,
        *,
        init_dir: str | Path,
        policy_hidden_size: int,
        dtype: torch.dtype,
        device: torch.device,
        lr: float,
        vf_coef: float,
        value_clip: float,
    ) -> Critic:
        """The critic saved in ``policy_dir/critic`` when there is one (it must be of ``kind``),
        else a fresh one: a zero head, and for kind ``model`` the backbone of ``init_dir``."""
        saved = critic_kind(policy_dir)
        if saved is not None and saved != kind:
            raise ClawError(
                f"{policy_dir}/critic holds a critic of kind {saved!r} but the config "
                f"asks for critic={kind!r}"
            )
        critic_dir = policy_dir / "critic"
        backbone = None
        hidden = policy_hidden_size
        if kind == "model":
            backbone = load_backbone(critic_dir if saved else init_dir, dtype).to(device)
            backbone.eval()
            hidden = backbone.config.hidden_size
        head = ValueHead(hidden, dtype).to(device)
        if saved:
            load_head(head, critic_dir)
        return cls(head=head, backbone=backbone, lr=lr, vf_coef=vf_coef, value_clip=value_clip)

    def modules(self) -> dict[str, torch.nn.Module]:
        """The trained modules by their stable names (``critic_model``, ``value_head``)."""
        backbone = {"critic_model": self.backbone} if self.backbone is not None else {}
        return {**backbone, "value_head": self.head}

    def values(
        self,
        batch: Batch,
        policy_hidden: torch.Tensor | None,
        replay: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """V(s_i) (B, N): the head on the policy's hidden states, or on the critic backbone's.

        ``replay`` (B, N, L, K) long, batch order: the experts an MoE backbone of the policy's
        layout sends each token to (the ones the policy's pass used; -1 rows live; gate weights
        from its own live router, so it still learns to route); None: it routes live."""
        if self.backbone is None:
            hidden = policy_hidden
        elif replay is None:
            hidden = backbone_hidden(self.backbone, batch)
        else:
            hidden = moe_hidden(self.backbone, batch, replay)[0]
        assert hidden is not None, "a head critic reads the policy's hidden states"
        return values_per_token(self.head, hidden, batch)

    def loss(self, v: torch.Tensor, v_old: torch.Tensor, R: torch.Tensor) -> torch.Tensor:
        """Per-token clipped value loss (M,)."""
        return losses.value_loss(v, v_old, R, self.value_clip if self.value_clip > 0 else None)

    def save(self, policy_dir: Path, backbone_state: dict | None = None) -> None:
        """Write ``policy_dir/critic/`` (``backbone_state``: the gathered weights under FSDP)."""
        if self.backbone is not None:
            self.backbone.save_pretrained(
                policy_dir / "critic", safe_serialization=True, state_dict=backbone_state
            )
        save_head(self.head, policy_dir / "critic")
