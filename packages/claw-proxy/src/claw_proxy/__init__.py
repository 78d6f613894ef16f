"""claw-proxy: the model-boundary proxy (OpenAI and Anthropic APIs, token-in/token-out, records)."""

import importlib as _importlib
import sys as _sys
import types as _types
import typing as _typing
from importlib.metadata import version as _version

from claw_proxy.config import ProxyConfig
from claw_proxy.errors import (
    AdminError,
    AuthError,
    ClawError,
    ConfigError,
    EngineError,
    LimitError,
    RecordError,
    RequestError,
)
from claw_proxy.records import Call, CallWriter, Policy, follow_calls, read_calls
from claw_proxy.routing import RoutingRows, read_routing
from claw_proxy.tokens import SessionToken, mint_token, read_secret, verify_token

if _typing.TYPE_CHECKING:
    from claw_proxy.admin import AdminClient, read_policy
    from claw_proxy.serve import ProxyServer, serve, serve_in_thread
    from claw_proxy.server import Proxy

# Names whose modules import the server (starlette, uvicorn) or the HTTP client (httpx) load on
# first use, so `import claw_proxy` and `claw-proxy --help` stay light.
_LAZY = {
    "AdminClient": "claw_proxy.admin",
    "read_policy": "claw_proxy.admin",
    "Proxy": "claw_proxy.server",
    "ProxyServer": "claw_proxy.serve",
    "serve": "claw_proxy.serve",
    "serve_in_thread": "claw_proxy.serve",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'claw_proxy' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


class _Package(_types.ModuleType):
    """`claw_proxy.serve` is the function: importing the submodule of that name (which binds
    the package attribute to the module) keeps the function there."""

    def __setattr__(self, name: str, value: object) -> None:
        if name == "serve" and isinstance(value, _types.ModuleType):
            value = value.serve
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package

__version__ = _version("claw-proxy")
__all__ = [
    "AdminClient",
    "AdminError",
    "AuthError",
    "Call",
    "CallWriter",
    "ClawError",
    "ConfigError",
    "EngineError",
    "LimitError",
    "Policy",
    "Proxy",
    "ProxyConfig",
    "ProxyServer",
    "RecordError",
    "RequestError",
    "RoutingRows",
    "SessionToken",
    "__version__",
    "follow_calls",
    "mint_token",
    "read_calls",
    "read_policy",
    "read_routing",
    "read_secret",
    "serve",
    "serve_in_thread",
    "verify_token",
]
