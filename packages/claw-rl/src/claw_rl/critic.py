"""The PPO critic: a value head on the policy's backbone, or a separate backbone with its own
head. Both live in ``<policy dir>/critic/`` next to a saved policy (a subdirectory, so HF and
vLLM loaders of the policy never see them):

* ``critic/value_head.safetensors`` - the linear head (both kinds);
* ``critic/config.json`` + ``critic/model.safetensors`` - the separate backbone (kind ``model``).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from claw_rl.errors import CheckpointError

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
