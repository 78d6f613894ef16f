"""Errors raised by claw-proxy. The CLI turns them into click errors with a hint.

The server turns `RequestError`, `AuthError`, `LimitError` and `EngineError` into HTTP
answers in the shape of the API that was called (OpenAI or Anthropic error bodies).
"""

from __future__ import annotations


class ClawError(Exception):
    """Base class of every error this package raises on purpose."""


class RequestError(ClawError):
    """A request the proxy cannot answer as sent (HTTP 400). `param` names the field."""

    status = 400
    kind = "invalid_request_error"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(f"{param}: {message}" if param else message)
        self.param = param


class AuthError(ClawError):
    """Missing, unknown or forged credentials (HTTP 401)."""

    status = 401
    kind = "authentication_error"


class NotFoundError(ClawError):
    """Unknown route or session (HTTP 404)."""

    status = 404
    kind = "not_found_error"


class LimitError(ClawError):
    """A configured limit was hit: body size (413) or per-session concurrency (429)."""

    kind = "rate_limit_error"

    def __init__(self, message: str, status: int = 429, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        if status == 413:
            self.kind = "request_too_large"
        elif status == 408:  # a client too slow to send its request
            self.kind = "invalid_request_error"


class EngineError(ClawError):
    """The inference engine failed or timed out (HTTP 5xx / 529 with retry-after)."""

    status = 503
    kind = "overloaded_error"

    def __init__(self, message: str, retry_after: float = 1.0, status: int = 503) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.status = status


class TransportError(EngineError):
    """The engine or upstream could not be reached, or broke off its answer."""


class ConfigError(ClawError):
    """Bad command-line or Python configuration (engine spec, route, secret file...)."""


class RecordError(ClawError):
    """A malformed record line; the message names the file and line."""


class AdminError(ClawError):
    """The proxy refused an admin call, or could not be reached (`status` None then).

    `status` is the HTTP status, `kind` the error type of the proxy's answer."""

    def __init__(self, message: str, status: int | None = None, kind: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
