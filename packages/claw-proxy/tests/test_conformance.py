"""Every shared conformance case (formats/conformance) through claw-proxy's readers.

The call reader (`read_calls`), the policy readers (`Policy.from_dict`, the body of
``POST /admin/policy``, and `read_policy`, a policies file) and the session-token check (`verify_token`) are strict: each case
gets exactly its verdict.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from claw_proxy._jsonbody import loads
from claw_proxy.admin import read_policy
from claw_proxy.errors import AuthError, ClawError, RecordError
from claw_proxy.records import Call, Policy, read_calls
from claw_proxy.tokens import verify_token

CONFORMANCE = Path(__file__).resolve().parents[3] / "formats" / "conformance"


def _cases(name: str) -> list[dict]:
    lines = (CONFORMANCE / name).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize("case", _cases("claw.call.v1.jsonl"), ids=lambda c: c["case"])
def test_call_cases(tmp_path, case):
    """read_calls gives every call case its verdict, naming file:line and field."""
    path = tmp_path / "calls.jsonl"
    path.write_text(case["line"] + "\n", encoding="utf-8")
    if case["verdict"] == "reject":
        with pytest.raises(RecordError) as err:
            list(read_calls(path))
        assert case["error"] in str(err.value) and "calls.jsonl:1" in str(err.value), str(err.value)
    else:
        calls = list(read_calls(path))
        assert len(calls) == (1 if case["verdict"] == "accept" else 0)
        if calls:  # a checked call writes back what it read, unknown fields included
            assert calls[0].to_dict().keys() >= json.loads(case["line"]).keys() - {"schema"}


@pytest.mark.parametrize("case", _cases("claw.policy.v1.jsonl"), ids=lambda c: c["case"])
def test_policy_cases(case):
    """Policy.from_dict, fed as the admin API feeds it, gives every policy case its verdict."""
    if case["verdict"] == "skip":  # a body is one JSON value; a blank body is no policy
        with pytest.raises(ClawError):
            loads(case["line"])
        return
    if case["verdict"] == "reject":
        with pytest.raises(ClawError) as err:
            Policy.from_dict(loads(case["line"]), "body")
        assert case["error"] in str(err.value), str(err.value)
    else:
        assert Policy.from_dict(loads(case["line"]), "body").name


@pytest.mark.parametrize("case", _cases("claw.policy.v1.jsonl"), ids=lambda c: c["case"])
def test_policy_file_cases(tmp_path, case):
    """read_policy (`AdminClient.reload` of a file, `claw-proxy admin reload`) gives every
    policy case its verdict as the last line of a policies.jsonl, naming file:line."""
    golden = _cases("claw.policy.v1.jsonl")[0]["line"]
    path = tmp_path / "policies.jsonl"
    path.write_text(golden + "\n" + case["line"] + "\n", encoding="utf-8")
    if case["verdict"] == "reject":
        with pytest.raises(RecordError) as err:
            read_policy(path)
        assert case["error"] in str(err.value) and "policies.jsonl:2" in str(err.value)
    else:  # skip: a blank last line is no record, the golden line before it is served
        want = json.loads(case["line"] if case["verdict"] == "accept" else golden)
        assert read_policy(path).to_dict()["version"] == want["version"]


@pytest.mark.parametrize("case", _cases("session-token.jsonl"), ids=lambda c: c["case"])
def test_session_token_cases(case):
    """verify_token accepts exactly the genuine tokens, with their session and tags."""
    if case["verdict"] == "accept":
        tok = verify_token(case["token"], case["secret"])
        assert (tok.session, tok.tags) == (case["session"], case["tags"])
    else:
        with pytest.raises(AuthError):
            verify_token(case["token"], case["secret"])


def test_unknown_fields_survive_a_pass_through():
    """A newer writer's field is kept by Call.from_dict and written back by to_dict."""
    line = next(
        c["line"] for c in _cases("claw.call.v1.jsonl") if c["case"] == "unknown top-level field"
    )
    d = json.loads(line)
    assert Call.from_dict(d).to_dict()["x_future"] == d["x_future"]
