"""`claw-proxy serve`'s flags are made from `ProxyConfig`: every field has its flag, with the
field's help and default, and the flags build the config they name."""

from __future__ import annotations

import attrs
import click
import pytest
from claw_proxy import ProxyConfig
from claw_proxy._serve_options import flag_name
from claw_proxy.cli import main
from click.testing import CliRunner
from proxy_testlib import TINY

# every flag `serve` had before its flags were made from the config (the README, the examples
# and the harness tests use them): none may go
FLAGS_BEFORE = [
    "--engine",
    "--replicas-file",
    "--replica-routing",
    "--secret-file",
    "--record",
    "--host",
    "--port",
    "--admin-token-file",
    "--route",
    "--tokenizer",
    "--policy-name",
    "--max-tokens-cap",
    "--default-max-tokens",
    "--max-body-bytes",
    "--session-concurrency",
    "--request-timeout",
    "--record-max-bytes",
    "--fsync",
    "--record-bodies",
    "--drift-check-tokens",
    "--drift-check",
    "--drift-full-every",
    "--upstream-key-env",
    "--student-ids",
    "--tool-parser",
    "--max-batch",
    "--batch-wait",
    "--vllm-reload-method",
    "--sampling",
    "--thinking",
    "--seed",
    "--max-prompt-tokens",
    "--prefix-cache-bytes",
    "--cpu-workers",
    "--header-timeout",
    "--body-timeout",
    "--max-connections",
    "--log-level",
]


def _serve_options() -> dict[str, click.Option]:
    cmd = main.commands["serve"]
    return {o.opts[0]: o for o in cmd.params if isinstance(o, click.Option)}


def test_every_field_has_its_flag_with_its_help_and_default():
    """One flag per config field, whose help is the field's help and whose default (for a flag
    that sets the field as given) is the field's default; every earlier flag is still there."""
    options = _serve_options()
    for f in attrs.fields(ProxyConfig):
        opt = options[flag_name(f)]
        assert opt.help == f.metadata["help"] and opt.help.strip(), f.name
        if f.metadata.get("kind") is None:
            assert opt.default == f.default, f.name
    assert set(FLAGS_BEFORE) <= set(options)
    assert len(options) == len(attrs.fields(ProxyConfig)) + 3  # + --host --port --log-level


def test_drifted_help_is_gone():
    """The config said the oldest idle connection is closed past --max-connections while the
    flag (and the server) close the one waiting longest for its headers: one text now."""
    f = attrs.fields_dict(ProxyConfig)["max_connections"]
    assert "waiting longest for its headers" in f.metadata["help"]
    assert "oldest idle" not in _serve_options()["--max-connections"].help


def _config(monkeypatch, tmp_path, *args) -> ProxyConfig:
    """The config `serve ARGS` would serve (the server itself is not started)."""
    import importlib

    got = []
    module = importlib.import_module("claw_proxy.serve")
    monkeypatch.setattr(module, "serve", lambda config, **kw: got.append(config))
    (tmp_path / "secret").write_text("s3\n")
    r = CliRunner().invoke(main, ["serve", "--secret-file", str(tmp_path / "secret"), *args])
    assert r.exit_code == 0, r.output
    return got[0]


def test_defaults_are_the_config_defaults(monkeypatch, tmp_path):
    """`serve` with only the required flags serves exactly the config's defaults."""
    engine = f"transformers:{TINY}"
    assert _config(monkeypatch, tmp_path, "--engine", engine) == ProxyConfig(
        engine=engine, secret="s3"
    )


def test_every_flag_reaches_its_field(monkeypatch, tmp_path):
    """Each flag, set to a value other than its default, lands in its field."""
    (tmp_path / "admin").write_text("adm\n")
    (tmp_path / "replicas").write_text("# more\nvllm:http://b:1  # two\n\nvllm:http://c:1\n")
    monkeypatch.setenv("UPSTREAM_KEY", "sk-1")
    record = str(tmp_path / "calls.jsonl")
    args = f"""--engine vllm:http://a:1 --replicas-file {tmp_path / "replicas"}
    --replica-routing random --record {record} --admin-token-file {tmp_path / "admin"}
    --route claude*=policy --route gpt*=scripted:x.jsonl --tokenizer {TINY} --policy-name p
    --tool-parser hermes --max-body-bytes 7 --max-tokens-cap 9 --default-max-tokens 8
    --sampling honor --max-temperature 1.5 --default-temperature 0.5 --thinking refuse
    --seed 3 --session-concurrency 2 --request-timeout 5.5 --record-max-bytes 1000 --fsync
    --record-bodies --drift-check-tokens 10 --drift-check full --drift-full-every 4
    --batch-wait 0.5 --max-batch 3 --upstream-key-env UPSTREAM_KEY --student-ids
    --vllm-reload-method load --max-prompt-tokens 11 --prefix-cache-bytes 12 --cpu-workers 2
    --header-timeout 1.5 --body-timeout 2.5 --max-connections 13""".split()
    got = _config(monkeypatch, tmp_path, *args)
    want = ProxyConfig(
        engine="vllm:http://a:1",
        replicas=("vllm:http://b:1", "vllm:http://c:1"),
        replica_routing="random",
        secret="s3",
        record=record,
        admin_token="adm",
        routes=(("claude*", "policy"), ("gpt*", "scripted:x.jsonl")),
        tokenizer=str(TINY),
        policy_name="p",
        parser="hermes",
        max_body_bytes=7,
        max_tokens_cap=9,
        default_max_tokens=8,
        sampling="honor",
        max_temperature=1.5,
        default_temperature=0.5,
        thinking="refuse",
        seed=3,
        session_concurrency=2,
        request_timeout=5.5,
        record_max_bytes=1000,
        record_fsync=True,
        record_bodies=True,
        drift_check_tokens=10,
        drift_check="full",
        drift_full_every=4,
        batch_wait=0.5,
        max_batch=3,
        upstream_api_key="sk-1",
        student_ids=True,
        vllm_reload_method="load",
        max_prompt_tokens=11,
        prefix_cache_bytes=12,
        cpu_workers=2,
        header_timeout=1.5,
        body_timeout=2.5,
        max_connections=13,
    )
    assert got == want
    defaults = ProxyConfig(engine="vllm:http://a:1", tokenizer=str(TINY), secret="s3")
    changed = {f.name for f in attrs.fields(ProxyConfig)}
    same = {n for n in changed if getattr(want, n) == getattr(defaults, n)}
    # the test sets every other field (dtype only applies to transformers engines: its own test)
    assert same <= {"engine", "tokenizer", "secret", "parser", "dtype"}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--max-connections", "0"], "x>=1"),
        (["--header-timeout", "0"], "x>0"),
        (["--drift-check", "sometimes"], "'sometimes' is not one of"),
    ],
)
def test_bounds_and_choices_of_the_config_are_the_flags(tmp_path, args, needle):
    """A value the config refuses is a usage error of its flag (exit 2)."""
    (tmp_path / "secret").write_text("s")
    r = CliRunner().invoke(
        main, ["serve", "--secret-file", str(tmp_path / "secret"), "--engine", "scripted:x", *args]
    )
    assert r.exit_code == 2 and needle in r.output


def test_the_config_checks_the_same_bounds():
    """The same metadata checks a config built in Python."""
    from claw_proxy.errors import ConfigError

    for bad, needle in (
        ({"max_connections": 0}, "max_connections must be >= 1"),
        ({"header_timeout": 0.0}, "header_timeout must be > 0"),
        ({"max_temperature": float("inf")}, "max_temperature must be a finite number"),
        ({"default_temperature": float("nan")}, "default_temperature must be a finite"),
        ({"replica_routing": "roundrobin"}, "replica_routing must be one of sticky, random"),
        ({"thinking": "drop"}, "thinking must be one of record, refuse"),
    ):
        with pytest.raises(ConfigError, match=needle):
            ProxyConfig(engine="scripted:x", secret="s", **bad)


def test_dtype_flag_reaches_its_field_and_is_checked(monkeypatch, tmp_path):
    """--dtype sets the transformers engines' dtype (default float32); an unknown dtype is a
    usage error of the flag; a dtype for a proxy with no transformers engine is refused,
    saying it does not apply there (also for a config built in Python)."""
    from claw_proxy.errors import ConfigError

    engine = f"transformers:{TINY}"
    assert _config(monkeypatch, tmp_path, "--engine", engine).dtype == "float32"
    got = _config(monkeypatch, tmp_path, "--engine", engine, "--dtype", "bfloat16")
    assert got == ProxyConfig(engine=engine, secret="s3", dtype="bfloat16")
    teacher = ["--engine", "vllm:http://a:1", "--route", f"t*={engine}", "--dtype", "float16"]
    assert _config(monkeypatch, tmp_path, *teacher).dtype == "float16"  # a routed engine's
    secret = ["serve", "--secret-file", str(tmp_path / "secret")]
    r = CliRunner().invoke(main, [*secret, "--engine", engine, "--dtype", "fp8"])
    assert r.exit_code == 2 and "'fp8' is not one of 'float32', 'bfloat16', 'float16'" in r.output
    r = CliRunner().invoke(main, [*secret, "--engine", "vllm:http://a:1", "--dtype", "bfloat16"])
    assert r.exit_code == 1
    assert "dtype bfloat16 applies only to transformers: engines" in r.output
    assert "vllm:http://a:1" in r.output
    with pytest.raises(ConfigError, match="dtype must be one of float32, bfloat16, float16"):
        ProxyConfig(engine=engine, secret="s", dtype="fp8")
    with pytest.raises(ConfigError, match="applies only to transformers: engines"):
        ProxyConfig(engine="scripted:x", secret="s", dtype="float16")


def test_bf16_server_serves_the_model_in_bf16(tmp_path):
    """`dtype="bfloat16"` (serve --dtype bfloat16): the engine's model is loaded in bf16, answers
    and records the call with finite logprobs; an MoE policy's routing is recorded too."""
    import math

    import httpx
    import torch
    from claw_proxy import ProxyServer, read_calls, read_routing
    from proxy_testlib import SECRET, token

    moe = TINY.parent / "tiny-qwen3-moe"
    record = tmp_path / "calls.jsonl"
    cfg = ProxyConfig(
        engine=f"transformers:{moe}", secret=SECRET, record=str(record), dtype="bfloat16"
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    with ProxyServer(cfg) as srv, httpx.Client(base_url=srv.url, timeout=60) as h:
        engine = srv.proxy.policy_engine
        model = engine._current[0]
        assert engine.dtype == "bfloat16" and model.dtype == torch.bfloat16
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
        r = h.post(
            "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {token('a')}"}
        )
        assert r.status_code == 200, r.text
    (call,) = read_calls(record)
    assert call.completion_ids and all(math.isfinite(x) for x in call.completion_logprobs)
    n = len(call.prompt_ids) + len(call.completion_ids) - 1
    assert read_routing(record, call).shape == (n, 2, 2)
