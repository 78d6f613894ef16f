"""HMAC-signed session tokens: the credential a harness sends as its API key.

Format (shared with every tool that mints tokens; each implements it itself)::

    token = "<session>.<sig>"  or  "<session>.<tags>.<sig>"

- ``session``: 1-128 characters of ``[A-Za-z0-9_-]`` (no dots).
- ``tags`` (optional): base64url without padding of the compact JSON object of session tags,
  ``json.dumps(tags, separators=(",", ":"), sort_keys=True)``.
- ``sig``: base64url without padding of ``HMAC-SHA256(key, msg)``, where ``key`` is the secret
  file's content with surrounding whitespace stripped (UTF-8) and ``msg`` is the token text
  before the last ``.`` (ASCII).

Harnesses send it as ``x-api-key: TOKEN`` or ``Authorization: Bearer TOKEN``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from pathlib import Path

import attrs

from claw_proxy.errors import AuthError, ConfigError

_SESSION = re.compile(r"[A-Za-z0-9_-]{1,128}")


def is_session_id(session: str) -> bool:
    """Whether `session` is a valid session id: 1-128 characters of [A-Za-z0-9_-]."""
    return _SESSION.fullmatch(session) is not None


@attrs.frozen(kw_only=True)
class SessionToken:
    """A verified token: the session id and the tags it carries."""

    session: str
    tags: dict = attrs.field(factory=dict)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _key(secret: str | bytes) -> bytes:
    if isinstance(secret, bytes):
        secret = secret.decode("utf-8")
    key = secret.strip().encode("utf-8")
    if not key:
        raise ConfigError("the session secret is empty")
    return key


def read_secret(path: str | Path) -> str:
    """Read a secret file (surrounding whitespace is not part of the secret)."""
    try:
        secret = Path(path).read_text(encoding="utf-8").strip()
    except OSError as e:
        raise ConfigError(f"cannot read secret file {path}: {e.strerror}") from e
    if not secret:
        raise ConfigError(f"secret file {path} is empty")
    return secret


def mint_token(session: str, secret: str | bytes, tags: dict | None = None) -> str:
    """Return a signed token for `session`, carrying `tags` when given."""
    if not _SESSION.fullmatch(session):
        raise ConfigError(f"session id {session!r} must be 1-128 characters of [A-Za-z0-9_-]")
    msg = session
    if tags:
        blob = json.dumps(tags, separators=(",", ":"), sort_keys=True).encode("utf-8")
        msg = f"{session}.{_b64(blob)}"
    sig = hmac.new(_key(secret), msg.encode("ascii"), hashlib.sha256).digest()
    return f"{msg}.{_b64(sig)}"


def verify_token(token: str, secret: str | bytes) -> SessionToken:
    """Check the signature of `token`; raise `AuthError` when it is malformed or forged.

    A strict reader of docs/formats.md, Session tokens (held to
    formats/conformance/session-token.jsonl): one canonical text per genuine token."""
    msg, dot, sig = token.strip().rpartition(".")
    if not dot or not msg or msg.count(".") > 1:
        raise AuthError("the API key is not a claw session token (expected <session>.<sig>)")
    if not token.isascii():
        raise AuthError("the API key is not a claw session token (not ASCII)")
    # the signature is compared as text: only the canonical unpadded base64url form is genuine
    want = _b64(hmac.new(_key(secret), msg.encode("ascii"), hashlib.sha256).digest())
    if not hmac.compare_digest(sig.encode("ascii"), want.encode("ascii")):
        raise AuthError("invalid session token (bad signature)")
    session, _, blob = msg.partition(".")
    if not _SESSION.fullmatch(session):
        raise AuthError("invalid session id in token")
    tags: dict = {}
    if blob:
        try:
            tags = json.loads(_unb64(blob))
        except ValueError as e:
            raise AuthError("invalid tags in session token") from e
        if not isinstance(tags, dict):
            raise AuthError("session token tags must be a JSON object")
    return SessionToken(session=session, tags=tags)


def token_from_headers(headers) -> str | None:
    """The credential a client sent: `x-api-key`, else `Authorization: Bearer ...`."""
    key = headers.get("x-api-key")
    if key:
        return key.strip()
    auth = headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return None
