"""tinylib."""

__version__ = "0.4.2"
