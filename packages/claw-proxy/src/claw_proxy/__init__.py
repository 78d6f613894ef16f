"""claw-proxy: see the package README."""

from importlib.metadata import version as _version

from claw_proxy.errors import ClawError

__version__ = _version("claw-proxy")
__all__ = ["ClawError", "__version__"]
