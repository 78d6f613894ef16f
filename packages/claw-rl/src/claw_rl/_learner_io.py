"""Saving policies (HF directory + claw.policy/v1) and checkpoints (resume bit-for-bit)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from claw_rl import _dist
from claw_rl.errors import CheckpointError, ClawError
from claw_rl.records import Policy

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".index.json")
_MODEL_FILES = ("config.json", "generation_config.json")


def copy_tokenizer_files(src: Path, dst: Path) -> None:
    """Copy every non-weight file (tokenizer, chat template, ...) from an HF dir to another."""
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(_WEIGHT_SUFFIXES) and f.name not in _MODEL_FILES:
            shutil.copy2(f, dst / f.name)


def _full_options() -> StateDictOptions:
    return StateDictOptions(full_state_dict=True, cpu_offload=True)


class LearnerIO:
    """Mixin of :class:`claw_rl.learner._Learner`: save, save_checkpoint, resume."""

    def _gather(self) -> dict[str, dict | None]:
        """Whole state dicts of the FSDP-sharded modules, on rank 0 (collective; {} without FSDP).

        A tied weight (the LM head sharing the embeddings) is gathered once per name; it is
        kept under the name ``named_parameters`` gives it, as ``save_pretrained`` expects.
        """
        if not self.fsdp:
            return {}
        out = {}
        for name, m in self._trained_modules().items():
            if m in self._large_modules():
                full = get_model_state_dict(m, options=_full_options())
                names = {n for n, _ in m.named_parameters()} | {n for n, _ in m.named_buffers()}
                out[name] = {k: v for k, v in full.items() if k in names}
        return out

    def _write_model_dir(self, out: Path, states: dict) -> None:
        out.mkdir(parents=True, exist_ok=True)
        copy_tokenizer_files(self.model_dir, out)
        self.model.save_pretrained(out, safe_serialization=True, state_dict=states.get("policy"))
        self._save_critic(out, states)

    def _save_critic(self, out: Path, states: dict) -> None: ...

    def save(self, out_dir: str | Path) -> dict:
        """Write the current weights as an HF directory and return its ``claw.policy/v1`` dict.

        The version grows by one when the weights changed since the last save. Under torchrun
        rank 0 writes; every rank returns the record.
        """
        out = Path(out_dir)
        taken = [self.rank == 0 and out.exists() and any(out.iterdir())]
        if self.world > 1:  # rank 0 decides for all: a rank left waiting in a collective would hang
            torch.distributed.broadcast_object_list(taken, src=0)
        if taken[0]:
            raise ClawError(f"{out}: directory exists and is not empty; choose a new directory")
        if self._dirty:
            self.version += 1
            self._dirty = False
        states = self._gather()
        if self.rank == 0:
            self._write_model_dir(out, states)
        if self.world > 1:
            torch.distributed.barrier()
        return Policy.now(
            name=self.config.name,
            version=self.version,
            path=str(out.resolve()),
            step=self.step_count,
            metrics=self.last_metrics,
        ).to_dict()

    def save_checkpoint(self, ckpt_dir: str | Path) -> Path:
        """Model (HF dir incl. critic), optimizer, RNG and counters: ``resume`` continues bit-for-bit."""
        d = Path(ckpt_dir)
        states = self._gather()
        # keyed by parameter name, whole tensors: resumable with or without FSDP, any world size
        optim_state = get_optimizer_state_dict(
            self._module_tree(), self.optimizer, options=_full_options()
        )
        if self.rank == 0:
            tmp = d.with_name(d.name + ".tmp")
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
            self._write_model_dir(tmp / "model", states)
            torch.save(optim_state, tmp / "optimizer.pt")
            torch.save(
                {"generator": self.generator.get_state(), "torch": torch.get_rng_state()},
                tmp / "rng.pt",
            )
            state = {
                "algo": self.algo,
                "version": self.version,
                "step_count": self.step_count,
                "dirty": self._dirty,
                "origin_dir": str(self.origin_dir.resolve()),
                "config": self.config.to_dict(),
                "last_metrics": self.last_metrics,
            }
            (tmp / "state.json").write_text(json.dumps(state, indent=1) + "\n")
            if d.exists():
                shutil.rmtree(d)
            tmp.rename(d)
        if self.world > 1:
            torch.distributed.barrier()
        return d

    def _module_tree(self) -> torch.nn.Module:
        """One module holding every trained module (names for the optimizer state)."""
        return torch.nn.ModuleDict(self._trained_modules())

    @classmethod
    def resume(cls, ckpt_dir: str | Path, *, device: str | None = None):
        """Rebuild a learner from :meth:`save_checkpoint` output."""
        from claw_rl.config import CONFIGS

        d = Path(ckpt_dir)
        try:
            state = json.loads((d / "state.json").read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{d}: not a claw-rl checkpoint ({exc})") from exc
        if state.get("algo") != cls.algo:
            raise CheckpointError(
                f"{d}: checkpoint is for algo {state.get('algo')!r}, not {cls.algo!r}"
            )
        config = CONFIGS[cls.algo].from_dict(state["config"], f"{d}/state.json")
        learner = cls(
            config,
            d / "model",
            version=state["version"],
            device=device,
            origin_dir=state["origin_dir"],
        )
        learner.step_count = state["step_count"]
        learner._dirty = state["dirty"]
        learner.last_metrics = state.get("last_metrics", {})
        optim_state = torch.load(d / "optimizer.pt", map_location=learner.device)
        set_optimizer_state_dict(
            learner._module_tree(), learner.optimizer, optim_state, options=_full_options()
        )
        rng = torch.load(d / "rng.pt")
        learner.generator.set_state(rng["generator"])
        torch.set_rng_state(rng["torch"])
        _dist.broadcast_params(learner._params())
        return learner
