"""`AdminClient` and `claw-proxy admin`: reload, rotate, stats and session close against a real
in-process proxy (scripted engine on the tiny model's tokenizer)."""

from __future__ import annotations

import json

import httpx
import pytest
from claw_proxy import AdminClient, AdminError, Policy, read_calls, read_policy
from claw_proxy.errors import RecordError
from proxy_testlib import ADMIN, token

ANTH = {"model": "claude-x", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}


def _ask(srv, session: str) -> str:
    r = httpx.post(srv.url + "/v1/messages", json=ANTH, headers={"x-api-key": token(session)})
    assert r.status_code == 200, r.text
    return r.json()["content"][0]["text"]


def _policy_file(tmp_path, version: int, text: str) -> dict:
    script = tmp_path / f"v{version}.jsonl"
    script.write_text(json.dumps({"text": text}) + "\n")
    return {"schema": "claw.policy/v1", "name": "policy", "version": version, "path": str(script)}


def test_client_reload_rotate_stats_close(make_server, tmp_path):
    """Each admin route through the client: the new policy answers and is recorded, rotate
    closes the shard holding the calls so far, stats count them, close ends the session."""
    srv = make_server(["old answer"])
    with AdminClient(srv.url, ADMIN) as admin:
        assert _ask(srv, "a1") == "old answer"
        pol = _policy_file(tmp_path, 2, "new answer")
        got = admin.reload(pol)
        assert got["ok"] is True and got["policy"] == {"name": "policy", "version": 2}
        assert _ask(srv, "a1") == "new answer"
        rotated = admin.rotate()
        assert rotated["lines"] == 2 and len(rotated["closed"]) == 1
        assert [c.policy["version"] for c in read_calls(rotated["closed"][0])] == [0, 2]
        stats = admin.stats()
        assert stats["records"] == 2 and stats["open_sessions"] == 1
        assert stats["policy"] == {"name": "policy", "version": 2}
        assert admin.tag_session("a1", {"task": "t1"})["tags"] == {"task": "t1"}
        assert admin.close_session("a1") == {"ok": True, "session": "a1", "calls": 2}
        assert admin.session("a1")["closed"] is True
        r = httpx.post(srv.url + "/v1/messages", json=ANTH, headers={"x-api-key": token("a1")})
        assert r.status_code == 401


def test_client_reload_takes_a_policies_file(make_server, tmp_path):
    """reload(path) serves the last record of a JSONL file (claw-rl's policies.jsonl) or a
    pretty-printed JSON object; a record object goes as is."""
    srv = make_server(["v0"])
    rows = [_policy_file(tmp_path, 1, "one"), _policy_file(tmp_path, 2, "two")]
    jsonl = tmp_path / "policies.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pretty = tmp_path / "policy.json"
    pretty.write_text(json.dumps(_policy_file(tmp_path, 3, "three"), indent=2))
    with AdminClient(srv.url, ADMIN) as admin:
        assert admin.reload(jsonl)["policy"]["version"] == 2
        assert _ask(srv, "p1") == "two"
        assert admin.reload(str(pretty))["policy"]["version"] == 3
        assert _ask(srv, "p2") == "three"
        assert admin.reload(Policy.from_dict(rows[0]))["policy"]["version"] == 1


def test_read_policy_names_the_bad_line(tmp_path):
    """A malformed last line or a non-policy record is an error naming the file and line."""
    bad = tmp_path / "policies.jsonl"
    bad.write_text('{"schema": "claw.policy/v1"}\n{not json\n')
    with pytest.raises(RecordError, match=r"policies.jsonl:2: the record is not valid JSON"):
        read_policy(bad)
    bad.write_text('{"schema": "claw.call/v1"}\n')
    with pytest.raises(RecordError, match=r"policies.jsonl:1"):
        read_policy(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(RecordError, match="no claw.policy/v1 record"):
        read_policy(empty)
    with pytest.raises(RecordError, match="cannot read the policy file"):
        read_policy(tmp_path / "missing.jsonl")


def test_client_errors_carry_the_proxy_answer(make_server, tmp_path):
    """A refusal raises AdminError with the proxy's status and message: a wrong token (401),
    an unknown session (404, or None with missing_ok), a policy that does not load (400), no
    recording (rotate 400), and an unreachable proxy (status None)."""
    srv = make_server(["x"])
    with AdminClient(srv.url, "wrong") as bad:
        with pytest.raises(AdminError, match="invalid admin token") as e:
            bad.stats()
        assert e.value.status == 401 and e.value.kind == "authentication_error"
    with AdminClient(srv.url, ADMIN) as admin:
        with pytest.raises(AdminError, match="unknown session 'nope'") as e:
            admin.close_session("nope")
        assert e.value.status == 404
        assert admin.close_session("nope", missing_ok=True) is None
        missing = {**_policy_file(tmp_path, 5, "x"), "path": str(tmp_path / "missing")}
        with pytest.raises(AdminError, match="neither a script file nor a directory") as e:
            admin.reload(missing)
        assert e.value.status == 400
    bare = make_server(["x"], record=None)
    with AdminClient(bare.url, ADMIN) as admin, pytest.raises(AdminError, match="records nothing"):
        admin.rotate()
    srv.stop()
    with AdminClient(srv.url, ADMIN, timeout=5) as gone, pytest.raises(AdminError) as e:
        gone.stats()
    assert e.value.status is None


def _admin_cli(srv, tmp_path, *args, token_text=ADMIN, input=None):
    from claw_proxy.cli import main
    from click.testing import CliRunner

    (tmp_path / "admin.txt").write_text(token_text + "\n")
    env = {"CLAW_PROXY_URL": srv.url, "CLAW_PROXY_ADMIN_TOKEN_FILE": str(tmp_path / "admin.txt")}
    return CliRunner().invoke(main, ["admin", *args], env=env, input=input)


def test_admin_cli_commands(make_server, tmp_path):
    """`claw-proxy admin reload|rotate|stats|session|close` print the proxy's answers as JSON
    lines, the URL and token file from the environment (or --url / --admin-token-file)."""
    srv = make_server(["old"])
    assert _ask(srv, "c1") == "old"
    pol = _policy_file(tmp_path, 4, "new")
    r = _admin_cli(srv, tmp_path, "reload", "-", input=json.dumps(pol) + "\n")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["policy"] == {"name": "policy", "version": 4}
    assert _ask(srv, "c1") == "new"
    r = _admin_cli(srv, tmp_path, "rotate")
    assert r.exit_code == 0 and json.loads(r.output)["lines"] == 2
    r = _admin_cli(srv, tmp_path, "stats")
    assert r.exit_code == 0 and json.loads(r.output)["records"] == 2
    r = _admin_cli(srv, tmp_path, "session", "c1", "--tag", "task=t2")
    assert r.exit_code == 0 and json.loads(r.output)["tags"] == {"task": "t2"}
    r = _admin_cli(srv, tmp_path, "close", "c1", "gone", "--missing-ok")
    assert r.exit_code == 0, r.output
    assert [json.loads(line) for line in r.output.splitlines()] == [
        {"ok": True, "session": "c1", "calls": 2},
        None,
    ]
    (tmp_path / "other.txt").write_text(ADMIN)
    r = _admin_cli(
        srv, tmp_path, "stats", "--url", srv.url, "--admin-token-file", str(tmp_path / "other.txt")
    )
    assert r.exit_code == 0 and json.loads(r.output)["open_sessions"] == 0


def test_admin_cli_errors(make_server, tmp_path):
    """A refusal is one error with the proxy's message and a hint, exit status 1."""
    srv = make_server(["x"])
    r = _admin_cli(srv, tmp_path, "stats", token_text="wrong")
    assert r.exit_code == 1 and "401 invalid admin token" in r.output and "hint:" in r.output
    r = _admin_cli(srv, tmp_path, "close", "nope")
    assert r.exit_code == 1 and "unknown session 'nope'" in r.output
    r = _admin_cli(srv, tmp_path, "reload", "-", input="{broken\n")
    assert r.exit_code == 1 and "<stdin>:1: the record is not valid JSON" in r.output
    r = _admin_cli(srv, tmp_path, "session", "s", "--tag", "novalue")
    assert r.exit_code == 2 and "is not KEY=VALUE" in r.output
