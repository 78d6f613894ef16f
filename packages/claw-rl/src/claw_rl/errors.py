"""Errors raised by claw-rl. The CLI turns them into click errors with a hint."""


class ClawError(Exception):
    """Base class of every error this package raises on purpose."""


class RecordError(ClawError):
    """A record (JSONL line or in-memory dict) is malformed: the message names file+line or field."""


class ConfigError(ClawError):
    """A learner configuration value or TOML file is invalid."""


class CheckpointError(ClawError):
    """A checkpoint or model directory is missing, incomplete or does not match the config."""


class BatchError(ClawError):
    """A step's published batch does not match its marker (``steps/<k>/batch.json``)."""


class WaitTimeout(ClawError):
    """What a run directory was polled for (a step's batch, a step's rows) did not come in time."""


class LearnerFailed(ClawError):
    """The learner (``claw-rl follow``) reported an error for a step (``steps/<k>/learner-error``)."""
