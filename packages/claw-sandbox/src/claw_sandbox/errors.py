"""Errors raised by claw-sandbox. The CLI turns them into click errors with a hint."""


class ClawError(Exception):
    """Base class of every error this package raises on purpose."""


class JobError(ClawError):
    """A job is invalid (malformed line, missing field, path escaping the workspace, bad image).

    The job is reported with ``status: error``; the other jobs still run.
    """


class InfraError(ClawError):
    """The sandbox could not be started or torn down; the scheduler retries these."""


class BackendUnavailable(ClawError):
    """The requested backend cannot run on this machine (the message says why)."""


class JobsFileError(ClawError):
    """The jobs file as a whole cannot be used (unreadable, duplicate job ids)."""


class ImageError(ClawError):
    """An OCI image (layout directory or `docker save` archive) cannot be unpacked safely."""


class BuildError(ClawError):
    """A Dockerfile that `claw-sandbox build` cannot build (the message names the line)."""
