"""claw-rl: PPO and GRPO learners on tree-packed samples (see the package README)."""

from importlib.metadata import version as _version

from claw_rl.errors import ClawError
from claw_rl.tiny import TinySpec, chat_template, init_tiny

__version__ = _version("claw-rl")
__all__ = ["ClawError", "TinySpec", "__version__", "chat_template", "init_tiny"]
