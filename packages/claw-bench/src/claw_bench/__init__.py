"""claw-bench: see the package README."""

from importlib.metadata import version as _version

from claw_bench.errors import ClawError

__version__ = _version("claw-bench")
__all__ = ["ClawError", "__version__"]
