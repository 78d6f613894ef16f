"""MoE routing in the records (issue 40): the in-process engine records the experts it routed
every forwarded token to, the writer stores them in the shard's `.routing` side store before
the call line, and readers check the reference and the bytes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from claw_proxy import Call, CallWriter, ProxyConfig, ProxyServer, read_calls, read_routing
from claw_proxy.cli import main as cli_main
from claw_proxy.errors import RecordError
from claw_proxy.routing import MAGIC, RoutingRows
from moe_testlib import build_tiny_moe, reference_routing
from proxy_testlib import SECRET, TINY, token


def _call(i: int, prompt: int = 5, completion: int = 3, **kw) -> dict:
    d = {
        "schema": "claw.call/v1",
        "call_id": f"c{i}",
        "session": "s",
        "seq": i,
        "api": "openai.chat",
        "model": "m",
        "policy": {"name": "p", "version": 0},
        "prompt_ids": list(range(1, prompt + 1)),
        "completion_ids": [7] * completion,
        "completion_logprobs": [-0.5] * completion,
        "finish_reason": "stop",
        "started_at": 1.0,
        "ended_at": 2.0,
        "tags": {},
    }
    d.update(kw)
    return d


def _rows(n: int, seed: int = 0, L: int = 2, K: int = 2, E: int = 8) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(E)[:K] for _ in range(n * L)]).reshape(n, L, K).astype("u1")


# --- the store ------------------------------------------------------------------------------


def test_writer_appends_routing_before_its_line_and_reads_it_back(tmp_path):
    """Two calls' arrays follow the magic back to back; each line's reference loads its own
    array; a call without routing gets no field, and a dense-only series no routing file."""
    path = tmp_path / "calls.jsonl"
    w = CallWriter(path)
    w.write(Call.from_dict(_call(0)))
    assert not (tmp_path / "calls.routing").exists()
    a, b = _rows(7, 1), _rows(4, 2)
    ra, rb = RoutingRows(rows=a, experts=8), RoutingRows(rows=b, experts=8)
    w.write(Call.from_dict(_call(1)), routing=ra)
    w.write(Call.from_dict(_call(2, prompt=2, completion=3)), routing=rb)
    w.close()
    assert ra.ref == {
        "file": "calls.routing",
        "offset": 8,
        "shape": [7, 2, 2],
        "dtype": "uint8",
        "experts": 8,
        "start": 0,
    }
    assert rb.ref is not None and rb.ref["offset"] == 8 + a.nbytes
    blob = (tmp_path / "calls.routing").read_bytes()
    assert blob == MAGIC + a.tobytes() + b.tobytes()
    calls = list(read_calls(path))
    assert calls[0].routing is None and "routing" not in calls[0].to_dict()
    assert calls[1].to_dict()["routing"] == ra.ref
    np.testing.assert_array_equal(read_routing(path, calls[1]), a)
    np.testing.assert_array_equal(read_routing(path, calls[2].to_dict()), b)


def test_int16_routing_for_more_than_255_experts(tmp_path):
    """E > 255 is stored as little-endian int16 and reads back."""
    path = tmp_path / "calls.jsonl"
    rows = np.array([[[300, 7]], [[1, 299]], [[0, 256]], [[5, 6]], [[8, 9]], [[10, 11]], [[3, 4]]])
    r = RoutingRows(rows=rows, experts=301)
    with_writer = CallWriter(path)
    with_writer.write(Call.from_dict(_call(0)), routing=r)
    with_writer.close()
    assert r.ref is not None and r.ref["dtype"] == "int16"
    assert (tmp_path / "calls.routing").read_bytes()[8:12] == (300).to_bytes(2, "little") + (
        7
    ).to_bytes(2, "little")
    np.testing.assert_array_equal(read_routing(path, next(read_calls(path))), rows)


def test_rotation_pairs_each_shard_with_its_routing_file(tmp_path):
    """`rotate` and `max_bytes` switch the routing file with the shard: the calls of
    calls.0000N.jsonl point into calls.0000N.routing, and every one loads."""
    path = tmp_path / "calls.jsonl"
    w = CallWriter(path, max_bytes=1500)
    arrays = {}
    for i in range(12):
        arrays[f"c{i}"] = _rows(7, i)
        w.write(Call.from_dict(_call(i)), routing=RoutingRows(rows=arrays[f"c{i}"], experts=8))
        if i == 3:
            w.rotate()
    w.close()
    shards = sorted(tmp_path.glob("calls*.jsonl"))
    assert len(shards) >= 3
    for shard in shards:
        for n, line in enumerate(shard.read_text().splitlines(), 1):
            d = json.loads(line)
            assert d["routing"]["file"] == shard.with_suffix(".routing").name
            got = read_routing(shard, d, where=f"{shard}:{n}")
            np.testing.assert_array_equal(got, arrays[d["call_id"]])
    assert sorted(p.with_suffix(".jsonl") for p in tmp_path.glob("calls*.routing")) == shards


def test_restarted_writer_appends_after_orphan_bytes(tmp_path):
    """Bytes a crash left after the last line are kept and skipped: a new writer appends
    after them; a torn magic is rewritten; a file that is not a routing file is refused."""
    path = tmp_path / "calls.jsonl"
    w = CallWriter(path)
    w.write(Call.from_dict(_call(0)), routing=RoutingRows(rows=_rows(7, 0), experts=8))
    w.close()
    with (tmp_path / "calls.routing").open("ab") as f:
        f.write(b"\x01\x02\x03")  # a call's bytes whose line was never written
    w = CallWriter(path)
    r = RoutingRows(rows=_rows(7, 5), experts=8)
    w.write(Call.from_dict(_call(1)), routing=r)
    w.close()
    assert r.ref is not None and r.ref["offset"] == 8 + 28 + 3
    calls = list(read_calls(path))
    np.testing.assert_array_equal(read_routing(path, calls[0]), _rows(7, 0))
    np.testing.assert_array_equal(read_routing(path, calls[1]), _rows(7, 5))

    torn = tmp_path / "t.jsonl"
    (tmp_path / "t.routing").write_bytes(MAGIC[:3])
    w = CallWriter(torn)
    w.write(Call.from_dict(_call(0)), routing=RoutingRows(rows=_rows(7), experts=8))
    w.close()
    np.testing.assert_array_equal(read_routing(torn, next(read_calls(torn))), _rows(7))

    alien = tmp_path / "a.jsonl"
    (tmp_path / "a.routing").write_bytes(b"something else entirely")
    w = CallWriter(alien)
    with pytest.raises(RecordError, match=r"a\.routing: not a routing file"):
        w.write(Call.from_dict(_call(0)), routing=RoutingRows(rows=_rows(7), experts=8))
    w.close()
    assert not alien.exists() or alien.read_text() == ""


def _ref(**kw) -> dict:
    r = {"file": "calls.routing", "offset": 8, "shape": [7, 2, 2], "dtype": "uint8", "experts": 8}
    r.update(kw)
    return r


PARENT = {"reused_tokens": 4, "rendered_tokens": 1, "parent_call": "c0"}


@pytest.mark.parametrize(
    ("routing", "prefix", "message"),
    [
        ({k: v for k, v in _ref().items() if k != "dtype"}, {}, "missing field 'routing.dtype'"),
        (_ref(dtype="float32"), {}, "'routing.dtype' must be one of"),
        (_ref(dtype="uint8", experts=300), {}, "uint8 for 300 experts"),
        (_ref(offset=-1), {}, "'routing.offset' must be an integer >= 8"),
        (_ref(offset=3), {}, "'routing.offset' must be an integer >= 8"),
        (_ref(shape=[6, 2, 2]), {}, r"T = 6, expected .* = 7"),
        (_ref(shape=[7, 0, 2]), {}, "'routing.shape' must be"),
        (_ref(shape=[7, 2, 9]), {}, "K = 9 > routing.experts"),
        (_ref(start=2, shape=[5, 2, 2]), {}, "'routing.start' is 2 but prefix.parent_call"),
        (_ref(start=5, shape=[2, 2, 2]), PARENT, r"past prefix.reused_tokens \(4\)"),
        (_ref(file="../x.routing"), {}, "'routing.file' must not have a '..' component"),
        (_ref(file="a/../../x.routing"), {}, "'..' component"),
        (_ref(file=""), {}, "'routing.file' must be a non-empty string"),
        ([1, 2], {}, "'routing' has the wrong type"),
    ],
)
def test_call_reader_rejects_bad_routing(routing, prefix, message):
    """`Call.from_dict` names the routing field at fault (the file is not opened)."""
    with pytest.raises(RecordError, match=message) as e:
        Call.from_dict(_call(0, routing=routing, prefix=prefix), where="calls.jsonl:3")
    assert str(e.value).startswith("calls.jsonl:3: ")


def test_call_reader_keeps_a_good_routing_with_start():
    """start > 0 with a parent and T = P + C - 1 - start reads and writes back unchanged."""
    ok = _ref(start=4, shape=[3, 2, 2], file="/abs/dir/calls.routing", extra_field=1)
    c = Call.from_dict(_call(0, routing=ok, prefix=PARENT))
    assert c.to_dict()["routing"] == ok
    empty = _ref(shape=[0, 2, 2])  # a call whose one sampled token was never fed back
    assert Call.from_dict(_call(0, prompt=1, completion=0, routing=empty)).routing == empty


def test_read_routing_checks_magic_size_and_values(tmp_path):
    """A wrong magic, a short file and an index >= E are refused, naming file and field."""
    path = tmp_path / "calls.jsonl"
    w = CallWriter(path)
    w.write(Call.from_dict(_call(0)), routing=RoutingRows(rows=_rows(7), experts=8))
    w.close()
    d = next(read_calls(path)).to_dict()
    with pytest.raises(RecordError, match=r"x.jsonl:1: field 'routing.experts'.*outside \[0, 5\)"):
        read_routing(path, {**d, "routing": {**d["routing"], "experts": 5}}, where="x.jsonl:1")
    with pytest.raises(
        RecordError, match=r"field 'routing.offset'.*has 36 bytes, the array needs 37"
    ):
        read_routing(path, {**d, "routing": {**d["routing"], "offset": 9}})
    with pytest.raises(RecordError, match="field 'routing.file': cannot read"):
        read_routing(path, {**d, "routing": {**d["routing"], "file": "nope.routing"}})
    (tmp_path / "calls.routing").write_bytes(b"CLAWRT0\n" + bytes(28))
    with pytest.raises(RecordError, match="field 'routing.file'.*not a routing file"):
        read_routing(path, d)
    with pytest.raises(RecordError, match="the call has no field 'routing'"):
        read_routing(path, _call(0))


# --- the engine and the server ------------------------------------------------------------------


@pytest.fixture(scope="module")
def moe(tmp_path_factory) -> Path:
    """A tiny Qwen3-MoE: 3 decoder layers, the middle one dense (L = 2), E = 8, K = 2."""
    return build_tiny_moe(tmp_path_factory.mktemp("moe"))


@pytest.fixture(scope="module")
def moe_model(moe):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(moe).eval()


def test_engine_routing_equals_a_plain_forward_under_continuous_batching(moe, moe_model):
    """Jobs of different prompt lengths (left padding), some joining while others decode and
    leaving at different lengths: each job's routing is exactly the router's top-k of a
    single-row forward over prompt + completion[:-1], in the engine's dense-layer-free order."""
    from claw_proxy._transformers import TransformersEngine
    from claw_proxy.engines import GenRequest

    async def main():
        engine = TransformersEngine(str(moe), max_batch=8, batch_wait=0.05)
        assert engine.routes
        jobs = []

        async def one(prompt, n, delay):
            await asyncio.sleep(delay)
            gen = engine.generate(
                GenRequest(prompt_ids=prompt, max_tokens=n, temperature=1.0, seed=len(prompt))
            )
            ids = [t for chunk in [c async for c in gen.chunks()] for t, _ in chunk]
            jobs.append((prompt, ids, gen))

        prompts = [[5 + i for i in range(n)] for n in (3, 9, 17, 6, 12)]
        lengths, delays = (80, 6, 12, 15, 4), (0, 0, 0, 0.1, 0.2)
        await asyncio.gather(
            *(one(p, n, d) for p, n, d in zip(prompts, lengths, delays, strict=True))
        )
        await engine.aclose()
        return engine, jobs

    engine, jobs = asyncio.run(main())
    assert engine.batches == 1 and engine.batched_rows == 5  # two jobs joined the running batch
    for prompt, ids, gen in jobs:
        assert gen.routing.dtype == np.uint8 and gen.experts == 8
        assert gen.routing.shape == (len(prompt) + len(ids) - 1, 2, 2)
        want = reference_routing(moe_model, prompt + ids[:-1])
        np.testing.assert_array_equal(gen.routing, want)


def test_dense_engine_hooks_nothing_and_puts_no_routing(tmp_path):
    """The dense tiny model: no router hooks, no routing, no routing file or field."""
    from claw_proxy._transformers import _Routers

    rec = tmp_path / "calls.jsonl"
    with ProxyServer(
        ProxyConfig(engine=f"transformers:{TINY}", secret=SECRET, record=str(rec))
    ) as srv:
        engine = srv.proxy.policy_engine
        assert not engine.routes and _Routers.of(engine._current[0]) is None
        assert all(not m._forward_hooks for m in engine._current[0].modules())
        r = httpx.post(
            srv.url + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            headers={"authorization": f"Bearer {token('d')}"},
        )
        assert r.status_code == 200
    assert "routing" not in json.loads(rec.read_text())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calls.jsonl", "calls.jsonl.index"]


def _full(path: Path, calls: dict[str, Call], c: Call) -> np.ndarray:
    """A call's routing for every forwarded token: its parents' rows before `start`."""
    own = read_routing(path, c)
    start = c.routing.get("start", 0)
    if not start:
        return own
    return np.concatenate([_full(path, calls, calls[c.prefix["parent_call"]])[:start], own])


def test_multi_turn_chat_records_routing_once_per_prefix(moe, moe_model, tmp_path):
    """An OpenAI client's three-turn conversation (plain, streamed, plain): turns 2 and 3 store
    only rows past their parent's (start > 0), and the rows, joined along the parent chain,
    equal a plain forward's routing of prompt + completion[:-1]; `claw-proxy calls` prints
    the reference through."""
    import openai

    rec = tmp_path / "calls.jsonl"
    with ProxyServer(
        ProxyConfig(engine=f"transformers:{moe}", secret=SECRET, record=str(rec))
    ) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key=token("chat"), max_retries=0)
        msgs = [{"role": "user", "content": "list the files"}]
        for turn in range(3):
            if turn == 1:
                stream = client.chat.completions.create(
                    model="m", messages=msgs, max_tokens=10, stream=True
                )
                text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
            else:
                r = client.chat.completions.create(model="m", messages=msgs, max_tokens=10)
                text = r.choices[0].message.content or ""
            msgs += [
                {"role": "assistant", "content": text},
                {"role": "user", "content": f"t{turn}"},
            ]
        stats = srv.proxy.stats
    calls = {c.call_id: c for c in read_calls(rec)}
    ordered = sorted(calls.values(), key=lambda c: c.seq)
    assert [c.routing["start"] > 0 for c in ordered] == [False, True, True]
    for c in ordered:
        ids = list(c.prompt_ids) + c.completion_ids[:-1]
        np.testing.assert_array_equal(_full(rec, calls, c), reference_routing(moe_model, ids))
    assert stats["routing_calls"] == 3 and stats["routing_prefix_mismatch_calls"] == 0
    assert stats["routing_rows"] == sum(c.routing["shape"][0] for c in ordered)
    lines = _cli_lines(["calls", str(rec)])
    assert [d["routing"] for d in lines] == [c.routing for c in ordered]


def _cli_lines(args: list[str]) -> list[dict]:
    from click.testing import CliRunner

    out = CliRunner().invoke(cli_main, args)
    assert out.exit_code == 0, out.output
    return [json.loads(x) for x in out.output.splitlines() if x.strip()]


def test_a_stop_sequence_cut_call_still_gets_its_routing(moe, moe_model, tmp_path):
    """A stop sequence ends the call mid-generation: the proxy waits for the engine's routing
    and stores the rows of the tokens the record keeps."""
    rec = tmp_path / "calls.jsonl"
    messages = [{"role": "user", "content": "go"}]
    body = {"model": "m", "messages": messages, "max_tokens": 24, "seed": 7}
    with (
        ProxyServer(
            ProxyConfig(engine=f"transformers:{moe}", secret=SECRET, record=str(rec))
        ) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as h,
    ):
        full = h.post(
            "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {token('a')}"}
        )
        text = full.json()["choices"][0]["message"]["content"]
        stop = text[len(text) // 2 : len(text) // 2 + 2]
        cut = h.post(
            "/v1/chat/completions",
            json={**body, "stop": [stop]},
            headers={"authorization": f"Bearer {token('a')}"},
        )
        assert cut.status_code == 200
    calls = list(read_calls(rec))
    assert len(calls) == 2 and len(calls[1].completion_ids) < len(calls[0].completion_ids)
    for c in calls:
        ids = list(c.prompt_ids) + c.completion_ids[:-1]
        np.testing.assert_array_equal(read_routing(rec, c), reference_routing(moe_model, ids))


@pytest.mark.slow
def test_kill_9_in_a_loop_leaves_every_line_with_its_routing(moe, moe_model, tmp_path):
    """A proxy process serving MoE calls is killed with SIGKILL three times mid-answer and
    restarted: every call line on disk has its routing bytes and they load (equal to a plain
    forward's routing); each restart appends after what is there; a rotation pairs the files."""
    (tmp_path / "secret").write_text(SECRET + "\n")
    (tmp_path / "admin").write_text("adm\n")
    record = tmp_path / "calls.jsonl"
    for round_ in range(3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [sys.executable, "-c", "from claw_proxy.cli import main; main()", "serve"]
        cmd += ["--engine", f"transformers:{moe}", "--port", str(port), "--record", str(record)]
        cmd += [
            "--secret-file",
            str(tmp_path / "secret"),
            "--admin-token-file",
            str(tmp_path / "admin"),
        ]
        proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(url)
            with httpx.Client(base_url=url, timeout=60) as h:
                for i in range(3):
                    body = {
                        "model": "m",
                        "messages": [{"role": "user", "content": f"r{round_} q{i}"}],
                        "max_tokens": 6,
                        "stream": i % 2 == 1,
                    }
                    r = h.post("/v1/chat/completions", json=body, headers=_auth(f"k{round_}{i}"))
                    assert r.status_code == 200
                if round_ == 1:
                    assert h.post(
                        "/admin/rotate", headers={"authorization": "Bearer adm"}
                    ).is_success
                # killed while a long answer streams (its routing never written, or orphaned)
                long = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
                with h.stream(
                    "POST",
                    "/v1/chat/completions",
                    json={**long, "stream": True, "max_tokens": 200, "ignore_eos": True},
                    headers=_auth(f"last{round_}"),
                ) as s:
                    next(s.iter_lines())
                    os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait()
    shards = sorted(tmp_path.glob("calls*.jsonl"))
    assert [p.name for p in shards] == ["calls.00001.jsonl", "calls.jsonl"]
    n = 0
    for shard in shards:
        for line in shard.read_text().splitlines():
            c = Call.from_dict(json.loads(line))
            assert c.routing["file"] == shard.with_suffix(".routing").name
            ids = list(c.prompt_ids) + c.completion_ids[:-1]
            np.testing.assert_array_equal(read_routing(shard, c), reference_routing(moe_model, ids))
            n += 1
    assert n >= 9  # every answered call (a killed one may be there too)


def _auth(session: str) -> dict:
    return {"authorization": f"Bearer {token(session)}"}


def _wait_healthy(url: str) -> None:
    for _ in range(600):
        try:
            if httpx.get(url + "/healthz").status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"{url} never became healthy")
