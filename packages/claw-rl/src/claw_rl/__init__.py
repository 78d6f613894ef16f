"""claw-rl: see the package README."""

from importlib.metadata import version as _version

from claw_rl.errors import ClawError

__version__ = _version("claw-rl")
__all__ = ["ClawError", "__version__"]
