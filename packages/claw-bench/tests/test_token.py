"""Session tokens follow the shared contract: <session>[.<tags>].<sig>, HMAC-SHA256, base64url."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from claw_bench import PlanError, mint_token, verify_token
from claw_bench.token import read_secret
from hypothesis import given
from hypothesis import strategies as st


def _b64(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def test_token_matches_the_contract_computed_by_hand(tmp_path):
    """The token equals the contract's construction from first principles (key from a stripped secret file)."""
    secret = tmp_path / "s"
    secret.write_text("  k3y\n")
    key = read_secret(secret)
    tags = {"task": "t1", "harness": "claw-agent-chat"}
    tok = mint_token("sess-1", key, tags)
    tag_part = _b64(b'{"harness":"claw-agent-chat","task":"t1"}')
    msg = f"sess-1.{tag_part}"
    assert tok == f"{msg}.{_b64(hmac.new(b'k3y', msg.encode(), hashlib.sha256).digest())}"
    assert mint_token("s", b"k") == f"s.{_b64(hmac.new(b'k', b's', hashlib.sha256).digest())}"


@given(
    session=st.from_regex(r"[A-Za-z0-9_-]{1,128}", fullmatch=True),
    tags=st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=8), max_size=3),
)
def test_round_trip_and_forgery(session, tags):
    """verify_token recovers session and tags; any change to the token is rejected."""
    tok = mint_token(session, b"key", tags)
    assert verify_token(tok, b"key") == (session, tags)
    assert verify_token(tok, b"other") is None
    assert verify_token(tok[:-1] + ("A" if tok[-1] != "A" else "B"), b"key") is None
    forged = f"x{session[1:]}" if session[0] != "x" else f"y{session[1:]}"
    assert verify_token(forged + tok[len(session) :], b"key") is None


def test_bad_session_and_secret(tmp_path):
    """Sessions outside the alphabet and empty or missing secret files are clear errors."""
    with pytest.raises(PlanError, match="session id"):
        mint_token("a.b", b"k")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(PlanError, match="empty"):
        read_secret(tmp_path / "empty")
    with pytest.raises(PlanError, match="cannot read"):
        read_secret(tmp_path / "missing")
