"""Session tokens, records, the tool-call parser: unit tests."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from pathlib import Path

import jsonschema
import pytest
from claw_proxy import (
    Call,
    CallWriter,
    Policy,
    RecordError,
    follow_calls,
    mint_token,
    read_calls,
    verify_token,
)
from claw_proxy.errors import AuthError
from claw_proxy.messages import ReasoningDelta, TextDelta, ToolCallEvent
from claw_proxy.toolparse import HermesParser
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = json.loads((ROOT / "formats" / "claw.call.v1.schema.json").read_text())


def _b64(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def test_token_format_is_the_documented_one():
    """A token computed by hand from the documented format verifies, with its tags."""
    tags = {"task": "t1", "harness": "claw-agent-chat"}
    msg = "run-7." + _b64(json.dumps(tags, separators=(",", ":"), sort_keys=True).encode())
    sig = _b64(hmac.new(b"k3y", msg.encode(), hashlib.sha256).digest())
    tok = verify_token(f"{msg}.{sig}", "  k3y\n")
    assert tok.session == "run-7" and tok.tags == tags
    assert mint_token("run-7", "k3y", tags) == f"{msg}.{sig}"
    assert verify_token(mint_token("plain", "k3y"), "k3y").tags == {}


@pytest.mark.parametrize("bad", ["", "nodot", "s1.!!!", "s1.AAAA", mint_token("s1", "other")])
def test_forged_tokens_are_refused(bad):
    """Malformed or forged tokens raise AuthError."""
    with pytest.raises(AuthError):
        verify_token(bad, "k3y")


def _call(i: int, session="s") -> Call:
    return Call(
        call_id=f"c{i}",
        session=session,
        seq=i,
        api="openai.chat",
        model="m",
        policy={"name": "p", "version": 0},
        engine="scripted:x",
        trainable=True,
        prompt_ids=[1, 2],
        completion_ids=[3],
        completion_logprobs=[-0.5],
        prefix={
            "reused_tokens": 0,
            "rendered_tokens": 2,
            "parent_call": None,
            "fresh_render_matches": True,
        },
        finish_reason="stop",
        sampling={
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": 0,
            "forced": False,
            "max_tokens": 5,
            "seed": None,
        },
        usage={"prompt_tokens": 2, "completion_tokens": 1},
        started_at=1.0,
        ended_at=2.0,
        tags={},
    )


def test_call_records_match_the_schema_and_round_trip(tmp_path):
    """Written calls validate against formats/claw.call.v1.schema.json and read back equal."""
    w = CallWriter(tmp_path / "calls.jsonl")
    for i in range(3):
        w.write(_call(i))
    w.close()
    back = list(read_calls(tmp_path / "calls.jsonl"))
    assert back == [_call(i) for i in range(3)]
    for c in back:
        jsonschema.validate(c.to_dict(), SCHEMA)
    for line in (ROOT / "formats" / "claw.call.v1.example.jsonl").read_text().splitlines():
        Call.from_dict(json.loads(line))


def test_records_shard_by_size_and_bad_lines_name_file_and_line(tmp_path):
    """Sharding keeps every call in order; a bad line is reported as file:line."""
    path = tmp_path / "calls.jsonl"
    w = CallWriter(path, max_bytes=1200)
    for i in range(10):
        w.write(_call(i))
    w.close()
    assert (tmp_path / "calls.00001.jsonl").exists()
    assert [c.seq for c in read_calls(path)] == list(range(10))
    with path.open("a") as f:
        f.write('{"schema": "claw.call/v2"}\n')
    with pytest.raises(RecordError, match=r"calls.jsonl:\d+: unsupported major version"):
        list(read_calls(path))
    with pytest.raises(RecordError, match="missing field 'version'"):
        Policy.from_dict({"schema": "claw.policy/v1", "name": "x", "path": "p"})


def test_follow_sees_calls_as_they_are_written(tmp_path):
    """follow_calls yields whole lines while a writer appends across shards."""
    path = tmp_path / "calls.jsonl"
    w = CallWriter(path, max_bytes=1500)
    done = threading.Event()

    def write():
        for i in range(8):
            w.write(_call(i))
            time.sleep(0.01)
        done.set()

    t = threading.Thread(target=write)
    t.start()
    got = [c.seq for c in follow_calls(path, poll=0.01, stop=done.is_set)]
    t.join()
    w.close()
    assert got == list(range(8))


def _run_parser(pieces):
    p = HermesParser()
    evs = []
    for piece in pieces:
        evs += p.feed(piece)
    evs += p.finish()
    text = "".join(e.text for e in evs if isinstance(e, TextDelta))
    reasoning = "".join(e.text for e in evs if isinstance(e, ReasoningDelta))
    calls = [(e.call.name, e.call.arguments) for e in evs if isinstance(e, ToolCallEvent)]
    return text, reasoning, calls


SAMPLE = (
    '<think>need ls</think>Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n'
    '</tool_call>\n<tool_call>\n{"name": "read", "arguments": "{\\"path\\": \\"a\\"}"}\n</tool_call>'
)


def test_parser_reads_text_reasoning_and_tool_calls():
    """Qwen3/Hermes output: reasoning, text without the trailing newline, two tool calls."""
    assert _run_parser([SAMPLE]) == (
        "Let me look.",
        "need ls",
        [("bash", {"command": "ls -la"}), ("read", {"path": "a"})],
    )
    assert _run_parser(["<tool_call>not json</tool_call> x"]) == (
        "<tool_call>not json</tool_call> x",
        "",
        [],
    )
    assert _run_parser(["a < b <tool"]) == ("a < b <tool", "", [])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(SAMPLE) - 1), max_size=12))
def test_parser_result_does_not_depend_on_how_text_is_split(cuts):
    """However the sampled text is split into deltas, the parsed answer is the same."""
    cuts = sorted(set(cuts))
    pieces = [SAMPLE[a:b] for a, b in zip([0, *cuts], [*cuts, len(SAMPLE)], strict=True)]
    assert _run_parser(pieces) == _run_parser([SAMPLE])


def test_import_does_not_pull_in_torch():
    """Only the transformers engine needs torch: importing the package does not load it."""
    import subprocess
    import sys

    code = "import sys, claw_proxy; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
