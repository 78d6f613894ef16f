"""Saving a learner's policy (HF directory + ``claw.policy/v1``) and whole checkpoints (resume
bit-for-bit), as plain functions of a :class:`claw_rl.learner.Learner`.

    policy = save_policy(learner, "runs/rl/policy/v1")   # claw.policy/v1 dict, version + 1
    save_checkpoint(learner, "runs/rl/checkpoint")
    learner = load_checkpoint("runs/rl/checkpoint")      # same algo, config, weights, optimizer, RNG

Under torchrun every rank calls these (FSDP gathers are collectives); rank 0 writes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from claw_rl import _dist, _lora
from claw_rl.errors import CheckpointError, ClawError
from claw_rl.learner import Learner
from claw_rl.records import Policy

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".index.json")
_MODEL_FILES = ("config.json", "generation_config.json")


def copy_tokenizer_files(src: Path, dst: Path) -> None:
    """Copy every non-weight file (tokenizer, chat template, ...) from an HF dir to another."""
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(_WEIGHT_SUFFIXES) and f.name not in _MODEL_FILES:
            shutil.copy2(f, dst / f.name)


def _full_states(learner: Learner) -> dict[str, dict]:
    """Whole state dicts of the learner's FSDP-sharded trained modules ({} without FSDP)."""
    if not learner.fsdp:
        return {}
    return _dist.full_state_dicts(learner.trained_modules(), learner.sharded_modules())


def _write_model_dir(learner: Learner, out: Path, states: dict[str, dict]) -> None:
    """The policy as an HF directory (tokenizer files from the learner's model dir), its critic
    in ``out/critic/``."""
    out.mkdir(parents=True, exist_ok=True)
    copy_tokenizer_files(learner.model_dir, out)
    if learner.adapter is not None:  # LoRA: the adapter alone, as a PEFT directory
        _lora.save(learner.adapter, out)
    else:
        learner.policy.save_pretrained(
            out, safe_serialization=True, state_dict=states.get("policy")
        )
    if learner.critic is not None:
        learner.critic.save(out, states.get("critic_model"))


def save_policy(learner: Learner, out_dir: str | Path) -> dict:
    """Write the current weights as an HF directory and return its ``claw.policy/v1`` dict.

    The version grows by one when the weights changed since the last save. A directory that
    exists and is not empty is refused (on every rank) before anything changes.
    """
    out = Path(out_dir)
    if _dist.rank0_decides(learner.rank == 0 and out.exists() and any(out.iterdir())):
        raise ClawError(f"{out}: directory exists and is not empty; choose a new directory")
    if learner.dirty:
        learner.version += 1
        learner.dirty = False
    states = _full_states(learner)
    if learner.rank == 0:
        _write_model_dir(learner, out, states)
    _dist.barrier()
    return Policy.now(
        name=learner.config.name,
        version=learner.version,
        path=str(out.resolve()),
        step=learner.step_count,
        metrics=learner.last_metrics,
    ).to_dict()


def _module_tree(learner: Learner) -> torch.nn.Module:
    """One module holding every trained module (parameter names for the optimizer state)."""
    return torch.nn.ModuleDict(learner.trained_modules())


def save_checkpoint(learner: Learner, ckpt_dir: str | Path) -> Path:
    """Model (HF dir incl. critic), optimizer, RNG and counters, replacing ``ckpt_dir`` whole
    (written next to it, then renamed): :func:`load_checkpoint` continues bit-for-bit."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    d = Path(ckpt_dir)
    states = _full_states(learner)
    # keyed by parameter name, whole tensors: resumable with or without FSDP, any world size
    optim_state = get_optimizer_state_dict(
        _module_tree(learner), learner.optimizer, options=_dist.full_options()
    )
    if learner.rank == 0:
        tmp = d.with_name(d.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        _write_model_dir(learner, tmp / "model", states)
        torch.save(optim_state, tmp / "optimizer.pt")
        torch.save(
            {"generator": learner.generator.get_state(), "torch": torch.get_rng_state()},
            tmp / "rng.pt",
        )
        state = {
            "algo": learner.algo,
            "version": learner.version,
            "step_count": learner.step_count,
            "dirty": learner.dirty,
            "origin_dir": str(learner.origin_dir.resolve()),
            "config": learner.config.to_dict(),
            "last_metrics": learner.last_metrics,
        }
        (tmp / "state.json").write_text(json.dumps(state, indent=1) + "\n")
        if d.exists():
            shutil.rmtree(d)
        tmp.rename(d)
    _dist.barrier()
    return d


def load_checkpoint(
    ckpt_dir: str | Path, *, algo: str | None = None, device: str | None = None
) -> Learner:
    """Rebuild a learner from :func:`save_checkpoint` output (``algo``: refuse another)."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    from claw_rl.config import CONFIGS

    d = Path(ckpt_dir)
    try:
        state = json.loads((d / "state.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{d}: not a claw-rl checkpoint ({exc})") from exc
    saved = state.get("algo")
    if saved not in CONFIGS or (algo is not None and saved != algo):
        want = repr(algo) if algo is not None else "one of " + ", ".join(CONFIGS)
        raise CheckpointError(f"{d}: checkpoint is for algo {saved!r}, not {want}")
    config = CONFIGS[saved].from_dict(state["config"], f"{d}/state.json")
    learner = Learner.from_config(
        config, d / "model", version=state["version"], device=device, origin_dir=state["origin_dir"]
    )
    # the non-weight files (tokenizer, chat template) of every later save come from the run's
    # origin: this checkpoint's own directory is removed once newer checkpoints replace it
    learner.model_dir = learner.origin_dir
    learner.step_count = state["step_count"]
    learner.dirty = state["dirty"]
    learner.last_metrics = state.get("last_metrics", {})
    optim_state = torch.load(d / "optimizer.pt", map_location=learner.device)
    set_optimizer_state_dict(
        _module_tree(learner), learner.optimizer, optim_state, options=_dist.full_options()
    )
    rng = torch.load(d / "rng.pt")
    learner.generator.set_state(rng["generator"])
    torch.set_rng_state(rng["torch"])
    _dist.broadcast_params(learner.params())
    return learner


__all__ = ["copy_tokenizer_files", "load_checkpoint", "save_checkpoint", "save_policy"]
