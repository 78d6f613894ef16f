"""claw-rl: PPO and GRPO learners on tree-packed samples (see the package README)."""

from importlib.metadata import version as _version

from claw_rl.config import GRPOConfig, PPOConfig
from claw_rl.errors import CheckpointError, ClawError, ConfigError, RecordError
from claw_rl.learner import GRPOLearner, PPOLearner
from claw_rl.packing import Batch, ancestor_matrix, chain_sample, pack
from claw_rl.records import Policy, Sample, read_samples
from claw_rl.tiny import TinySpec, chat_template, init_tiny

__version__ = _version("claw-rl")
__all__ = [
    "Batch",
    "CheckpointError",
    "ClawError",
    "ConfigError",
    "GRPOConfig",
    "GRPOLearner",
    "PPOConfig",
    "PPOLearner",
    "Policy",
    "RecordError",
    "Sample",
    "TinySpec",
    "__version__",
    "ancestor_matrix",
    "chain_sample",
    "pack",
    "chat_template",
    "init_tiny",
    "read_samples",
]
