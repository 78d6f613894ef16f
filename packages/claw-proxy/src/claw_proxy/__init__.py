"""claw-proxy: the model-boundary proxy (OpenAI and Anthropic APIs, token-in/token-out, records)."""

from importlib.metadata import version as _version

from claw_proxy.admin import AdminClient, read_policy
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
from claw_proxy.serve import ProxyServer, serve, serve_in_thread
from claw_proxy.server import Proxy
from claw_proxy.tokens import SessionToken, mint_token, read_secret, verify_token

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
    "SessionToken",
    "__version__",
    "follow_calls",
    "mint_token",
    "read_calls",
    "read_policy",
    "read_secret",
    "serve",
    "serve_in_thread",
    "verify_token",
]
