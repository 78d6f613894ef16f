"""claw-sandbox: see the package README."""

from importlib.metadata import version as _version

from claw_sandbox.errors import ClawError

__version__ = _version("claw-sandbox")
__all__ = ["ClawError", "__version__"]
