"""claw-tree: see the package README."""

from importlib.metadata import version as _version

from claw_tree.errors import ClawError

__version__ = _version("claw-tree")
__all__ = ["ClawError", "__version__"]
