"""Session tokens: ``<session>.<sig>`` or ``<session>.<tags>.<sig>``, HMAC-SHA256 signed.

The contract shared with claw-proxy (which verifies): ``session`` is 1-128 chars of
[A-Za-z0-9_-]; ``tags`` is base64url (no padding) of the compact, key-sorted JSON of the
session tags; ``sig`` is base64url (no padding) of HMAC-SHA256(key, msg) where key is the
secret file's content stripped of surrounding whitespace (UTF-8) and msg is the token text
before the last ".".
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from pathlib import Path

from claw_bench.errors import PlanError

SESSION = re.compile(r"[A-Za-z0-9_-]{1,128}")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def read_secret(path: str | Path) -> bytes:
    """The HMAC key held in a secret file (whitespace around it stripped); PlanError if unusable."""
    try:
        key = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise PlanError(f"{path}: cannot read the proxy secret: {exc.strerror}") from exc
    if not key:
        raise PlanError(f"{path}: the proxy secret file is empty")
    return key.encode("utf-8")


def mint_token(session: str, key: bytes, tags: dict[str, str] | None = None) -> str:
    """A signed session token for ``session`` carrying ``tags`` (omitted when empty)."""
    if not SESSION.fullmatch(session):
        raise PlanError(f"session id {session!r} must be 1-128 chars of [A-Za-z0-9_-]")
    msg = session
    if tags:
        msg += "." + _b64(json.dumps(tags, separators=(",", ":"), sort_keys=True).encode("utf-8"))
    sig = hmac.new(key, msg.encode("ascii"), hashlib.sha256).digest()
    return f"{msg}.{_b64(sig)}"


def verify_token(token: str, key: bytes) -> tuple[str, dict[str, str]] | None:
    """(session, tags) when the token is genuine, else None (the proxy's check, for tests and tools).

    The rules of docs/formats.md, Session tokens, held to formats/conformance/session-token.jsonl.
    """
    msg, dot, sig = token.rpartition(".")
    parts = msg.split(".")
    if not dot or not token.isascii() or len(parts) > 2 or not SESSION.fullmatch(parts[0]):
        return None
    want = _b64(hmac.new(key, msg.encode("ascii"), hashlib.sha256).digest())
    if not hmac.compare_digest(want.encode("ascii"), sig.encode("ascii")):
        return None
    if len(parts) == 1:
        return parts[0], {}
    try:
        tags = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except ValueError:
        return None
    return (parts[0], tags) if isinstance(tags, dict) else None
