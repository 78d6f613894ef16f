"""Errors raised by claw-tree. The CLI turns them into click errors with a hint."""


class ClawError(Exception):
    """Base class of every error this package raises on purpose."""


class RecordError(ClawError):
    """A JSONL line or record dict is malformed; the message names file, line and field."""


class ConflictError(ClawError):
    """Two records claim the same identity (call_id, session outcome) with different content."""


class BudgetError(ClawError):
    """A single root-to-leaf path does not fit the sample token budget."""


class ValuesError(ClawError):
    """Per-token critic values do not line up with the samples they are meant for."""
