"""Harness adapters as data: the shipped TOMLs load, render and detect installation; bad ones are named."""

from __future__ import annotations

import os
import stat

import pytest
from claw_bench import HarnessError, list_harnesses, load_harness
from claw_bench.harnesses import INSTRUCTION_FILE, PLACEHOLDERS

SHIPPED = {
    "claude-code",
    "openclaw-chat",
    "openclaw-anthropic",
    "openclaw-responses",
    "codex",
    "mini-swe-agent",
    "claw-agent-chat",
    "claw-agent-anthropic",
    "claw-agent-text",
}


def _values(**kw):
    v = {k: f"<{k}>" for k in PLACEHOLDERS}
    v.update(
        base_url="http://127.0.0.1:9", port="9", token="sess.tags.sig", instruction="it's a task"
    )
    v.update(kw)
    return v


def test_shipped_adapters_load_with_their_apis():
    """Every shipped adapter loads; APIs match what each harness speaks."""
    hs = {h.name: h for h in list_harnesses()}
    assert set(hs) >= SHIPPED
    assert hs["claude-code"].api == "anthropic" and hs["codex"].api == "responses"
    assert [hs[f"openclaw-{v}"].api for v in ("chat", "anthropic", "responses")] == [
        "chat",
        "anthropic",
        "responses",
    ]
    assert hs["mini-swe-agent"].api == "chat" and hs["claw-agent-anthropic"].api == "anthropic"
    assert hs["claw-agent-chat"].installed() and not hs["claw-agent-chat"].requires


def test_render_points_the_harness_at_the_proxy():
    """Rendering fills env, config files and the command; the instruction is shell-quoted in the command."""
    cmd, env, files = load_harness("claude-code").render(_values())
    assert (
        env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9"
        and env["ANTHROPIC_API_KEY"] == "sess.tags.sig"
    )
    assert "'it'\"'\"'s a task'" in cmd
    assert files[INSTRUCTION_FILE] == "it's a task"
    cmd, env, files = load_harness("openclaw-anthropic").render(_values())
    cfg = files[".claw_harness/openclaw.json5"]
    assert (
        'baseUrl: "http://127.0.0.1:9"' in cfg
        and 'api: "anthropic-messages"' in cfg
        and "sess.tags.sig" in cfg
    )
    _, _, files = load_harness("codex").render(_values())
    assert 'base_url = "http://127.0.0.1:9/v1"' in files[".claw_harness/codex/config.toml"]
    cmd, env, _ = load_harness("claw-agent-chat").render(_values(python="/py"))
    assert (
        cmd.startswith("/py -m claw_bench.agent --api chat")
        and env["OPENAI_BASE_URL"] == "http://127.0.0.1:9/v1"
    )


def test_user_adapter_from_a_directory_and_installed_check(tmp_path, monkeypatch):
    """$CLAW_BENCH_HARNESSES adds adapters; installed means every required executable is on PATH."""
    (tmp_path / "my-agent.toml").write_text(
        'api = "chat"\nrequires = ["my-agent-bin"]\ninstruction = "stdin"\ncommand = "my-agent-bin --go"\n'
        '[env]\nMY_URL = "{{base_url}}/v1"\n'
    )
    monkeypatch.setenv("CLAW_BENCH_HARNESSES", str(tmp_path))
    h = load_harness("my-agent")
    assert h.name == "my-agent" and not h.installed()
    assert h.render(_values())[0] == f"my-agent-bin --go < {INSTRUCTION_FILE}"
    exe = tmp_path / "bin" / "my-agent-bin"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{exe.parent}{os.pathsep}{os.environ['PATH']}")
    assert h.installed()
    assert "my-agent" in {x.name for x in list_harnesses()}


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('api = "grpc"\ncommand = "x {{instruction}}"\n', r"field 'api': unknown API 'grpc'"),
        (
            'api = "chat"\ncommand = "x {{instruction}}"\n[env]\nK = "{{secret}}"\n',
            r"unknown placeholder \{\{secret\}\}",
        ),
        ('api = "chat"\ncommand = "x"\n', r"must contain \{\{instruction\}\}"),
        (
            'api = "chat"\ncommand = "x {{instruction_file}}"\ninstruction = "file"\nextra = 1\n',
            r"unknown field\(s\) \['extra'\]",
        ),
        ('api = "chat"\n', r"field 'command'"),
        ('api = "chat\n', "invalid TOML"),
    ],
)
def test_bad_adapters_name_the_file_and_field(tmp_path, text, match):
    """Unknown API, unknown placeholder, missing instruction slot, unknown field and bad TOML are named."""
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(HarnessError, match=match) as info:
        load_harness(p)
    assert str(p) in str(info.value)


def test_unknown_harness_lists_the_known_ones():
    """Asking for an adapter that does not exist names the known adapters."""
    with pytest.raises(HarnessError, match="unknown harness 'nope'.*claude-code"):
        load_harness("nope")
