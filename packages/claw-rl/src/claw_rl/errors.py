"""Errors raised by claw-rl. The CLI turns them into click errors with a hint."""


class ClawError(Exception):
    """Base class of every error this package raises on purpose."""
