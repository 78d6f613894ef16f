"""claw-rl: PPO and GRPO learners on tree-packed samples (see the package README)."""

import importlib as _importlib
import typing as _typing
from importlib.metadata import version as _version

from claw_rl.config import GRPOConfig, PPOConfig, RLConfig, SFTConfig, TrainConfig
from claw_rl.errors import (
    BatchError,
    CheckpointError,
    ClawError,
    ConfigError,
    LearnerFailed,
    RecordError,
    WaitTimeout,
)
from claw_rl.records import Policy, Sample, read_samples
from claw_rl.tiny import TinySpec, chat_template, init_tiny, prompt_corpus, prompt_spec

if _typing.TYPE_CHECKING:
    from claw_rl.checkpoint import load_checkpoint, save_checkpoint, save_policy
    from claw_rl.learner import Learner
    from claw_rl.packing import Batch, ancestor_matrix, chain_sample, pack

# Names whose modules import torch load on first use, so `import claw_rl` (and `claw-rl --help`)
# stays light.
_LAZY = {
    "Learner": "claw_rl.learner",
    "load_checkpoint": "claw_rl.checkpoint",
    "save_checkpoint": "claw_rl.checkpoint",
    "save_policy": "claw_rl.checkpoint",
    "Batch": "claw_rl.packing",
    "ancestor_matrix": "claw_rl.packing",
    "chain_sample": "claw_rl.packing",
    "pack": "claw_rl.packing",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'claw_rl' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__version__ = _version("claw-rl")
__all__ = [
    "Batch",
    "BatchError",
    "CheckpointError",
    "ClawError",
    "ConfigError",
    "GRPOConfig",
    "Learner",
    "LearnerFailed",
    "PPOConfig",
    "Policy",
    "RLConfig",
    "RecordError",
    "SFTConfig",
    "Sample",
    "TinySpec",
    "TrainConfig",
    "WaitTimeout",
    "__version__",
    "ancestor_matrix",
    "chain_sample",
    "pack",
    "chat_template",
    "init_tiny",
    "prompt_corpus",
    "prompt_spec",
    "load_checkpoint",
    "read_samples",
    "save_checkpoint",
    "save_policy",
]
