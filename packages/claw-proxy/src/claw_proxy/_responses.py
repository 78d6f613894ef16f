"""Errors as HTTP responses in the shape of the API that was called (shared by the server and the admin routes)."""

from __future__ import annotations

from starlette.responses import JSONResponse

from claw_proxy import api_anthropic
from claw_proxy.errors import ClawError, EngineError, RecordError


def error_response(api, e: ClawError) -> JSONResponse:
    """An error in the shape of the API that was called."""
    status = getattr(e, "status", 500)
    kind = getattr(e, "kind", "api_error")
    if api is not api_anthropic:
        kind = {
            "overloaded_error": "server_error",
            "not_found_error": "invalid_request_error",
            "request_too_large": "invalid_request_error",
            "api_error": "server_error",
        }.get(kind, kind)
    if isinstance(e, EngineError) and api is api_anthropic and status == 503:
        status = 529
    headers = {}
    retry = getattr(e, "retry_after", None)
    if retry is not None:
        headers["retry-after"] = f"{max(1, round(retry))}"
    if isinstance(e, RecordError):
        status, kind = 400, "invalid_request_error"
    return JSONResponse(
        api.error_body(kind, str(e), getattr(e, "param", None)), status_code=status, headers=headers
    )


__all__ = ["error_response"]
