"""Errors raised by claw-bench. The CLI turns them into click errors with a hint."""


class ClawError(Exception):
    """Base class of every error this package raises on purpose."""


class TaskError(ClawError):
    """A task directory or suite is malformed (names the task, file and field)."""


class HarnessError(ClawError):
    """A harness adapter TOML is malformed or unknown (names the file and field)."""


class RecordError(ClawError):
    """A JSONL record is malformed (names the file, line and field)."""


class PlanError(ClawError):
    """Planning jobs failed: bad proxy URL, missing secret, no tasks selected."""


class DockerError(ClawError):
    """The docker CLI is missing or no Docker engine answers it (listing and building task images)."""


class JudgeError(ClawError):
    """The judge could not be asked or its answer holds no score in [0, 1]; ``retryable`` when
    asking again may help (network error, HTTP 5xx / 429, a reply of the wrong shape)."""

    def __init__(self, message: str, *, retryable: bool = False):
        super().__init__(message)
        self.retryable = retryable
