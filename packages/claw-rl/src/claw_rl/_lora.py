"""LoRA adapters (peft) on the learner's policy: build, load and save them.

The learner keeps training the plain HF model (:func:`claw_rl.forward.backbone_hidden` and the
LM head work unchanged): peft injects its LoRA layers into it and freezes every other weight,
and the :class:`peft.PeftModel` around it is kept only to save the adapter. A policy directory
of a LoRA run is a standard PEFT adapter directory (``adapter_config.json`` +
``adapter_model.safetensors``, plus the tokenizer files): vLLM loads it with
``/v1/load_lora_adapter``, claw-proxy's transformers engine on its own base model, and
``peft.PeftModel.from_pretrained(base, DIR)`` anywhere. ``base_model_name_or_path`` in
``adapter_config.json`` is the base model's absolute path, so a run can continue from an adapter
directory (``--model runs/rl/policy/v3``, ``--resume``).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from claw_rl.config import TrainConfig
from claw_rl.errors import ClawError

ADAPTER_CONFIG = "adapter_config.json"


def _peft() -> Any:
    try:
        import peft
    except ImportError as exc:
        raise ClawError(
            f"LoRA needs the peft package ({exc}); install claw-rl with the extra: "
            "pip install 'claw-rl[lora]'"
        ) from exc
    return peft


@contextmanager
def _quiet() -> Iterator[None]:
    """peft asks transformers' deprecated ``is_gradient_checkpointing`` (a FutureWarning)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)
        yield


def is_adapter(model_dir: str | Path) -> bool:
    """Whether ``model_dir`` is a PEFT adapter directory (not a whole model)."""
    return (Path(model_dir) / ADAPTER_CONFIG).is_file()


def base_of(adapter_dir: str | Path) -> Path:
    """The base model directory an adapter directory was trained on."""
    path = Path(adapter_dir) / ADAPTER_CONFIG
    try:
        base = json.loads(path.read_text()).get("base_model_name_or_path")
    except (OSError, json.JSONDecodeError, AttributeError) as exc:
        raise ClawError(f"{path}: not a readable PEFT adapter config ({exc})") from exc
    if not isinstance(base, str) or not (Path(base) / "config.json").is_file():
        raise ClawError(
            f"{path}: base_model_name_or_path = {base!r} is not a model directory on this "
            "machine; start from the base model (--model BASE) instead"
        )
    return Path(base)


def _targets(config: TrainConfig) -> str | list[str]:
    if config.lora_targets.strip() == "all-linear":
        return "all-linear"
    return [t.strip() for t in config.lora_targets.split(",") if t.strip()]


def attach(model: torch.nn.Module, config: TrainConfig) -> Any:
    """A new LoRA adapter (``config.lora_rank``) on ``model``: every other weight frozen; the
    ``PeftModel`` (for saving) whose base is ``model`` itself, trained in place."""
    peft = _peft()
    lora = peft.LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        lora_dropout=0.0,  # the learner runs in eval mode: pi_old and pi_theta are one function
        target_modules=_targets(config),
        bias="none",
    )
    try:
        with _quiet():
            return peft.get_peft_model(model, lora)
    except ValueError as exc:  # e.g. a target module name the model does not have
        raise ClawError(f"cannot attach a LoRA adapter: {exc}") from exc


def load(adapter_dir: str | Path, model: torch.nn.Module) -> Any:
    """The adapter of ``adapter_dir`` on ``model`` (its base), trainable: the ``PeftModel``."""
    peft = _peft()
    try:
        with _quiet():
            return peft.PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ClawError(f"{adapter_dir}: cannot load the LoRA adapter ({exc})") from exc


def merged(adapter_dir: str | Path, model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with the adapter of ``adapter_dir`` merged into its weights (a frozen
    reference, a critic backbone)."""
    peft = _peft()
    with _quiet():
        return peft.PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()


def save(adapter: Any, out: Path) -> None:
    """The adapter as a PEFT directory in ``out`` (only the adapter's weights)."""
    adapter.save_pretrained(out, safe_serialization=True)


__all__ = ["attach", "base_of", "is_adapter", "load", "merged", "save"]
