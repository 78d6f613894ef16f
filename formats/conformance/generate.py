"""Regenerate the conformance cases from the golden examples: `python formats/conformance/generate.py`.

Each case is a golden example line with one change and the verdict every reader must give it
(see README.md in this directory). The generated JSONL files are the contract; this script only
keeps them easy to review and extend. Standard library only.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
FORMATS = HERE.parent
_MISSING = object()


def golden(name: str) -> list[dict]:
    path = FORMATS / f"claw.{name}.v1.example.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def line(rec: dict) -> str:
    return json.dumps(rec, separators=(",", ":"), ensure_ascii=False)


def changed(rec: dict, path: str, value: object = _MISSING) -> dict:
    """A copy of `rec` with dotted `path` set to `value` (removed when no value is given)."""
    out = copy.deepcopy(rec)
    *parents, leaf = path.split(".")
    node = out
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if isinstance(node, list):
        node[int(leaf)] = value
    elif value is _MISSING:
        del node[leaf]
    else:
        node[leaf] = value
    return out


def case(
    name: str, text: str, verdict: str, field: str | None = None, error: str | None = None
) -> dict:
    c: dict = {"case": name, "line": text, "verdict": verdict, "field": field}
    if verdict == "reject":
        c["error"] = error if error is not None else field.rsplit(".", 1)[-1]
    return c


def common(kind: str, g: dict, other: str, number_field: str) -> list[dict]:
    """Cases every record type gets: goldens, unknown fields, versions, JSON shape, blank lines."""
    schema = f"claw.{kind}/v1"
    out = [case(f"golden line {i + 1}", line(r), "accept") for i, r in enumerate(golden(kind))]
    out += [
        case("unknown top-level field", line({**g, "x_future": {"a": [1, 2]}}), "accept"),
        case("fields in another order", line(dict(reversed(list(g.items())))), "accept"),
        case(
            "wrong major version",
            line({**g, "schema": f"claw.{kind}/v2"}),
            "reject",
            "schema",
            "v2",
        ),
        case("another record type", line({**g, "schema": other}), "reject", "schema", other),
        case("missing schema", line(changed(g, "schema")), "reject", "schema"),
        case("schema not a string", line({**g, "schema": 1}), "reject", "schema"),
        case("not JSON (cut line)", line(g)[:40], "reject", None, "JSON"),
        case("JSON array, not an object", "[1, 2, 3]", "reject", None, "object"),
        case("JSON string, not an object", json.dumps(schema), "reject", None, "object"),
        case("blank line", "   ", "skip"),
        case("empty line", "", "skip"),
    ]
    marked = line(changed(g, number_field, 0.123456789))
    nan, inf, ninf = (marked.replace("0.123456789", t) for t in ("NaN", "Infinity", "-Infinity"))
    out += [
        case(f"NaN in {number_field} (not JSON)", nan, "reject", None, "NaN"),
        case(f"Infinity in {number_field} (not JSON)", inf, "reject", None, "Infinity"),
        case(f"-Infinity in {number_field} (not JSON)", ninf, "reject", None, "Infinity"),
    ]
    return out


def missing(g: dict, fields: list[str]) -> list[dict]:
    return [case(f"missing {f}", line(changed(g, f)), "reject", f) for f in fields]


def bad(g: dict, items: list[tuple[str, object, str]], error: str | None = None) -> list[dict]:
    """(field, value, why) -> one reject case each."""
    return [case(f"{f} {why}", line(changed(g, f, v)), "reject", f, error) for f, v, why in items]


def good(g: dict, items: list[tuple[str, object, str]]) -> list[dict]:
    out = []
    for f, v, why in items:
        rec = changed(g, f) if v is _MISSING else changed(g, f, v)
        out.append(case(f"{f} {why}", line(rec), "accept"))
    return out


def calls() -> list[dict]:
    g = golden("call")[1]
    out = common("call", g, "claw.policy/v1", "completion_logprobs.0")
    out += missing(
        g,
        [
            "call_id",
            "session",
            "seq",
            "api",
            "model",
            "policy",
            "policy.name",
            "policy.version",
            "prompt_ids",
            "completion_ids",
            "completion_logprobs",
            "finish_reason",
            "started_at",
            "ended_at",
            "tags",
        ],
    )
    out += good(
        g,
        [
            ("engine", _MISSING, "absent"),
            ("trainable", _MISSING, "absent (true)"),
            ("prefix", _MISSING, "absent"),
            ("usage", _MISSING, "absent"),
            ("sampling", _MISSING, "absent (older proxy: 1, 1, 0)"),
            ("sampling.x_future", True, "unknown key"),
            ("policy.x_future", "a", "unknown key"),
            ("prefix.fresh_render_matches", False, "false (a false fork avoided)"),
            ("prefix.fork_reason", "record_unreadable", "record_unreadable (a re-render fork)"),
            ("sampling.temperature", 0.6, "0.6 (honored request)"),
            ("sampling.top_k", 20, "20"),
            ("sampling.top_p", 0.8, "0.8"),
            ("sampling.temperature", 0, "0 (greedy)"),
            ("request", {"messages": []}, "raw request kept"),
            ("api", "anthropic.messages", "anthropic.messages"),
            ("finish_reason", "tool_calls", "tool_calls"),
            ("completion_logprobs", [0.0, -0.01], "0.0 (greedy token)"),
        ],
    )
    passthrough = {
        **g,
        "trainable": False,
        "prompt_ids": [],
        "completion_ids": [],
        "completion_logprobs": [],
    }
    out.append(case("passthrough call with no ids", line(passthrough), "accept"))
    out += bad(
        g,
        [
            ("call_id", "", "empty"),
            ("call_id", 7, "a number"),
            ("session", "", "empty"),
            ("session", None, "null"),
            ("seq", -1, "negative"),
            ("seq", "1", "a string"),
            ("seq", 1.5, "a fraction"),
            ("seq", True, "a boolean"),
            ("api", "openai.completions", "unknown value"),
            ("model", 4, "a number"),
            ("policy", "tiny", "a string"),
            ("policy.name", 0, "a number"),
            ("policy.version", -1, "negative"),
            ("policy.version", "0", "a string"),
            ("policy.version", 0.5, "a fraction"),
            ("prompt_ids", [1, -17, 29, 5, 40, 41, 2, 8, 9], "with a negative id"),
            ("prompt_ids", [1, 17.5, 29, 5, 40, 41, 2, 8, 9], "with a fraction"),
            ("prompt_ids", "1 17 29", "a string"),
            ("completion_ids", [44, -2], "with a negative id"),
            ("completion_ids", [44, "2"], "with a string"),
            ("completion_ids", [44, True], "with a boolean"),
            ("completion_ids", [44, None], "with null"),
            ("completion_logprobs", [-0.7], "shorter than completion_ids"),
            ("completion_logprobs", [-0.7, "x"], "with a string"),
            ("completion_logprobs", [-0.7, None], "with null"),
            ("completion_logprobs", "-0.7", "a string"),
            ("finish_reason", "eos", "unknown value"),
            ("trainable", "yes", "a string"),
            ("tags", ["hello"], "a list"),
            ("started_at", "now", "a string"),
            ("started_at", -1, "negative"),
            ("ended_at", None, "null"),
            ("prefix", "c-0001", "a string"),
            ("prefix.reused_tokens", -1, "negative"),
            ("prefix.rendered_tokens", "2", "a string"),
            ("prefix.fork_reason", 1, "a number"),
            ("prefix.fork_of", "", "empty"),
            ("sampling", "hot", "a string"),
            ("sampling.temperature", -0.5, "negative"),
            ("sampling.temperature", "1", "a string"),
            ("sampling.top_p", 0, "zero"),
            ("sampling.top_p", 1.5, "above 1"),
            ("sampling.top_k", -2, "below -1"),
            ("sampling.top_k", 2.5, "a fraction"),
            ("sampling.forced", "no", "a string"),
            ("usage", [], "a list"),
            ("engine", 3, "a number"),
        ],
    )
    return out + call_routing(g) + call_kept(g)


def call_kept(g: dict) -> list[dict]:
    """The engine's kept-set sizes (docs/formats.md, claw.call/v1 completion_kept): golden line 2
    sampled at top_k 6 keeps 5 other tokens with each of its two."""
    top6 = changed(g, "sampling.top_k", 6)
    kept = {**top6, "completion_kept": [5, 5]}
    out = [case("completion_kept (top_k 6)", line(kept), "accept")]
    out += good(kept, [("completion_kept", [0, -1], "with 0 and -1 (untruncated)")])
    out += bad(
        kept,
        [
            ("completion_kept", [5], "shorter than completion_ids"),
            ("completion_kept", [5, -2], "below -1"),
            ("completion_kept", [5, 4.5], "with a fraction"),
            ("completion_kept", [5, "5"], "with a string"),
            ("completion_kept", [5, True], "with a boolean"),
            ("completion_kept", [5, None], "with null"),
            ("completion_kept", "5,5", "a string"),
        ],
    )
    return out


# an MoE call's routing (docs/formats.md, Routing store): golden line 2 holds 9 + 2 tokens and
# reuses 7 of its parent's (4 + 3, whose routing covers 6): its own rows are tokens 6 .. 9
ROUTING = {"file": "calls.routing", "offset": 8, "shape": [4, 2, 2], "dtype": "uint8", "experts": 8}


def call_routing(g: dict) -> list[dict]:
    routed = {**g, "routing": {**ROUTING, "start": 6}}
    every_row = {**g, "routing": {**ROUTING, "shape": [10, 2, 2]}}
    out = [
        case("routing with start (rows after the parent's)", line(routed), "accept"),
        case("routing.start absent (0) with every row", line(every_row), "accept"),
    ]
    out += good(
        routed,
        [
            ("routing.file", "/runs/a/calls.routing", "absolute (in memory)"),
            ("routing.dtype", "int16", "int16"),
            ("routing.x_future", 1, "unknown key"),
        ],
    )
    out += missing(
        routed,
        ["routing.file", "routing.offset", "routing.shape", "routing.dtype", "routing.experts"],
    )
    out += bad(
        routed,
        [
            ("routing", "calls.routing", "a string"),
            ("routing.file", "", "empty"),
            ("routing.file", "../calls.routing", "with a .. component"),
            ("routing.file", "runs/../../calls.routing", "with a .. component inside"),
            ("routing.offset", -1, "negative"),
            ("routing.offset", 4, "inside the magic"),
            ("routing.offset", "8", "a string"),
            ("routing.dtype", "float32", "not an index type"),
            ("routing.dtype", "uint16", "uint16"),
            ("routing.shape", [4, 2], "of two dimensions"),
            ("routing.shape", [4, 0, 2], "with no layers"),
            ("routing.shape", [5, 2, 2], "with T not P + C - 1 - start"),
            ("routing.experts", 0, "zero"),
            ("routing.start", -1, "negative"),
            ("routing.start", 8, "past prefix.reused_tokens"),
        ],
    )
    orphan = changed(routed, "prefix.parent_call", None)
    out.append(
        case("routing.start without prefix.parent_call", line(orphan), "reject", "routing.start")
    )
    return out


def outcomes() -> list[dict]:
    g, infra = golden("outcome")
    out = common("outcome", g, "claw.run/v1", "reward")
    out += missing(g, ["session", "task", "harness", "group", "reward", "passed", "status"])
    out += good(
        g,
        [
            ("sample", _MISSING, "absent"),
            ("job_id", _MISSING, "absent"),
            ("details", _MISSING, "absent"),
            ("reward", 0, "0"),
            ("reward", 1, "1 (an integer)"),
            ("passed", False, "false"),
            ("policy_version", 3, "3"),
            ("policy_version", None, "null"),
            ("meta", {"run_id": "r1"}, "an object"),
            ("error", None, "null"),
            ("group", "hello+claw-agent-chat", "a task+harness key"),
        ],
    )
    out.append(case("not_scorable with nulls", line({**infra, "status": "not_scorable"}), "accept"))
    out += bad(
        g,
        [
            ("session", "", "empty"),
            ("task", "", "empty"),
            ("harness", 1, "a number"),
            ("group", None, "null"),
            ("reward", 1.5, "above 1"),
            ("reward", -0.1, "below 0"),
            ("reward", "1", "a string"),
            ("reward", True, "a boolean"),
            ("reward", None, "null although status is ok"),
            ("passed", "yes", "a string"),
            ("passed", None, "null although status is ok"),
            ("status", "failed", "unknown value"),
            ("sample", -1, "negative"),
            ("sample", "0", "a string"),
            ("job_id", 7, "a number"),
            ("details", [1], "a list"),
            ("policy_version", "1", "a string"),
            ("policy_version", -1, "negative"),
            ("error", 5, "a number"),
            ("meta", "x", "a string"),
        ],
    )
    out += bad(
        infra,
        [
            ("reward", 0.5, "set although status is infra_error"),
            ("passed", False, "set although status is infra_error"),
        ],
    )
    return out


def samples() -> list[dict]:
    g = golden("sample")[0]
    n = len(g["input_ids"])
    out = common("sample", g, "claw.call/v1", "advantages.4")
    out += missing(
        g,
        [
            "sample_id",
            "algo",
            "input_ids",
            "position_ids",
            "parent",
            "trainable",
            "logprobs",
            "advantages",
            "loss_weights",
        ],
    )
    out += good(
        g,
        [
            ("policy_versions", _MISSING, "absent"),
            ("sessions", _MISSING, "absent"),
            ("groups", _MISSING, "absent"),
            ("n_paths", _MISSING, "absent"),
            ("tags", _MISSING, "absent"),
            ("returns", [0.0] * n, "present (ppo targets)"),
            ("algo", "rloo", "rloo"),
            ("algo", "sft", "sft (supervised fine-tuning)"),
            ("temperatures", [1.0] * n, "per-token temperatures"),
            ("top_ps", [1.0] * n, "per-token top_p"),
            ("top_ks", [0] * n, "per-token top_k"),
        ],
    )
    forked = {
        **g,
        "input_ids": [1, 2, 3, 4],
        "position_ids": [0, 1, 2, 2],
        "parent": [-1, 0, 1, 1],
        "trainable": [0, 1, 1, 1],
        "logprobs": [0, -1, -1, -1],
        "advantages": [0, 1, 1, 1],
        "loss_weights": [0, 0.5, 0.25, 0.25],
        "policy_versions": [-1, 0, 0, 0],
    }
    out.append(case("a fork (two paths share a prefix)", line(forked), "accept"))

    def one(key: str, i: int, value: object) -> list:
        out = list(g[key])
        out[i] = value
        return out

    neg, frac = one("input_ids", 3, -5), one("input_ids", 3, 5.5)
    par, pos = one("parent", 4, 4), one("position_ids", 4, 7)
    tr, root = one("trainable", 4, 2), one("trainable", 0, 1)
    lw, adv = one("loss_weights", 4, -0.2), one("advantages", 4, "0.5")
    pv = one("policy_versions", 4, -2)
    out += bad(
        g,
        [
            ("sample_id", 3, "a number"),
            ("algo", "dpo", "unknown value"),
            ("input_ids", neg, "with a negative id"),
            ("input_ids", frac, "with a fraction"),
            ("input_ids", "1 17", "a string"),
            ("position_ids", pos, "not the depth"),
            ("parent", par, "not before the child"),
            ("trainable", tr, "with a 2"),
            ("trainable", root, "on a root token"),
            ("loss_weights", lw, "negative"),
            ("logprobs", g["logprobs"][:-1], "shorter than input_ids"),
            ("advantages", adv, "with a string"),
            ("returns", [0.0] * (n - 1), "of the wrong length"),
            ("policy_versions", pv, "below -1"),
            ("sessions", "s-3f2a", "a string"),
            ("groups", [1], "not strings"),
            ("n_paths", -1, "negative"),
            ("tags", [], "a list"),
            ("temperatures", [1.0] * (n - 1), "of the wrong length"),
            ("temperatures", [-1.0] + [1.0] * (n - 1), "negative"),
            ("top_ps", [0.0] + [1.0] * (n - 1), "with a zero"),
            ("top_ps", [1.5] * n, "above 1"),
            ("top_ks", [-1] + [0] * (n - 1), "negative"),
            ("top_ks", [0.5] * n, "fractions"),
        ],
    )
    return out + sample_routing(g) + sample_kept(g)


def sample_kept(g: dict) -> list[dict]:
    """The engine's kept-set sizes carried to a sample (docs/formats.md, claw.sample/v1 kept):
    -1 for context tokens and tokens without a record."""
    n = len(g["input_ids"])
    sizes = [-1, -1, -1, -1, 5, 5, 0, -1, -1, 19, -1]
    assert len(sizes) == n
    out = [case("kept (the engine's kept-set sizes)", line({**g, "kept": sizes}), "accept")]
    out += bad(
        {**g, "kept": sizes},
        [
            ("kept", sizes[:-1], "of the wrong length"),
            ("kept", [-2] + sizes[1:], "below -1"),
            ("kept", [0.5] + sizes[1:], "with a fraction"),
            ("kept", ["1"] + sizes[1:], "with a string"),
            ("kept", [True] + sizes[1:], "with a boolean"),
            ("kept", "5", "a string"),
        ],
    )
    return out


def sample_routing(g: dict) -> list[dict]:
    """An MoE sample's routing: one int16 row (L, K) per token in the sample's own side store
    (docs/formats.md, claw.sample/v1 and Routing store)."""
    n = len(g["input_ids"])
    ref = {"file": "samples.routing", "offset": 8, "shape": [n, 2, 2], "dtype": "int16"}
    routed = {**g, "routing": {**ref, "experts": 8}}
    out = [case("routing (a side-store reference)", line(routed), "accept")]
    out += good(routed, [("routing.shape", [n, 48, 8], "48 layers, top 8")])
    out += missing(
        routed,
        ["routing.file", "routing.offset", "routing.shape", "routing.dtype", "routing.experts"],
    )
    out += bad(
        routed,
        [
            ("routing", "samples.routing", "a string"),
            ("routing.file", "../samples.routing", "with a .. component"),
            ("routing.offset", -8, "negative"),
            ("routing.offset", 0, "inside the magic"),
            ("routing.dtype", "uint8", "uint8 (samples are int16)"),
            ("routing.shape", [n - 1, 2, 2], "not matching N"),
            ("routing.shape", [n, 2], "of two dimensions"),
            ("routing.experts", 0, "zero"),
        ],
    )
    return out


def policies() -> list[dict]:
    g = golden("policy")[0]
    out = common("policy", g, "claw.sample/v1", "created_at")
    out += missing(g, ["name", "version", "path"])
    out += good(
        g,
        [
            ("created_at", _MISSING, "absent"),
            ("step", _MISSING, "absent"),
            ("metrics", _MISSING, "absent"),
            ("version", 0, "0 (initial weights)"),
            ("metrics", {"kl": 0.01, "clip_frac": 0.2}, "several"),
        ],
    )
    out += bad(
        g,
        [
            ("name", "", "empty"),
            ("name", 1, "a number"),
            ("version", -1, "negative"),
            ("version", "1", "a string"),
            ("version", 1.5, "a fraction"),
            ("version", True, "a boolean"),
            ("version", None, "null"),
            ("path", "", "empty"),
            ("path", ["runs"], "a list"),
            ("created_at", "today", "a string"),
            ("created_at", -1, "negative"),
            ("step", -1, "negative"),
            ("step", 1.5, "a fraction"),
            ("metrics", [0.1], "a list"),
        ],
    )
    return out + transfers(g)


TRANSFER = {
    "method": "broadcast",
    "address": "10.0.0.5:29555",
    "backend": "gloo",
    "buckets": [
        {
            "names": ["model.embed_tokens.weight", "model.norm.weight"],
            "dtypes": ["bfloat16", "float32"],
            "shapes": [[64, 8], [8]],
            "bytes": 1056,
        },
        {
            "names": ["model.layers.0.mlp.up_proj.weight"],
            "dtypes": ["bfloat16"],
            "shapes": [[24, 8]],
            "bytes": 384,
        },
    ],
}


def transfers(g: dict) -> list[dict]:
    """A policy whose weights come over a process group (docs/formats.md, Weight transfer)."""
    t = {**g, "transfer": TRANSFER}
    b = "transfer.buckets.0"
    out = [case("transfer (weights over a process group)", line(t), "accept")]
    out += good(
        t,
        [
            ("transfer.backend", "nccl", "nccl"),
            ("transfer.lora_scaling", 2.0, "LoRA adapter"),
            ("transfer.x_future", 1, "unknown key"),
        ],
    )
    out += missing(
        t, ["transfer.method", "transfer.address", "transfer.backend", "transfer.buckets"]
    )
    out += bad(
        t,
        [
            ("transfer", "10.0.0.5:29555", "a string"),
            ("transfer.method", "files", "another method"),
            ("transfer.address", "10.0.0.5", "without a port"),
            ("transfer.backend", "mpi", "mpi"),
            ("transfer.buckets", [], "empty"),
            ("transfer.lora_scaling", 0, "zero"),
            (f"{b}.names", [], "empty"),
            (f"{b}.names.0", "", "an empty name"),
            (f"{b}.dtypes.0", "float8", "an unknown dtype"),
            (f"{b}.shapes.1", [-1], "a negative dimension"),
            (f"{b}.bytes", 1040, "not the tensors' aligned size"),
            (f"{b}.dtypes", ["bfloat16"], "fewer than names"),
        ],
    )
    return out


def jobs() -> list[dict]:
    g, bare = golden("job")
    out = common("job", g, "claw.run/v1", "timeout_s")
    out += missing(g, ["job_id", "command"])
    out += missing(g, ["verify.command", "network.policy"])
    out += good(
        g,
        [
            ("workspace", _MISSING, "absent"),
            ("verify", None, "null"),
            ("verify", _MISSING, "absent"),
            ("limits", _MISSING, "absent"),
            ("network", _MISSING, "absent"),
            ("env", _MISSING, "absent"),
            ("limits.x_future", 1, "unknown key"),
            ("verify.x_future", 1, "unknown key"),
            ("network.x_future", 1, "unknown key"),
            ("workspace.x_future", 1, "unknown key"),
            ("command", ["python3", "agent.py"], "an argv list"),
            ("keep", "failed", "failed"),
            ("timeout_s", 0.5, "a fraction"),
            ("limits.cpus", 0.5, "a fraction"),
            ("image", None, "null"),
            ("meta", {}, "empty"),
            ("workdir", "/app", "absolute"),
            ("profile", "harbor", "harbor"),
            ("mounts", [{"target": "/logs/verifier"}], "one writable directory"),
            (
                "verify.mounts",
                [{"target": "/tests", "files": {"test.sh": "exit 0\n"}}],
                "one at verify time",
            ),
            ("image_run", ["RUN apt-get install -y jq"], "a list"),
            ("image_env", {"PATH": "/opt/x/bin:/usr/bin:/bin"}, "strings"),
            ("verify.reset", [".verify"], "a directory the verifier owns"),
            ("services", [{"name": "db", "image": "postgres:16"}], "a sidecar"),
            (
                "services",
                [{"name": "web", "image": "srv:1", "healthcheck": {"command": ["true"]}}],
                "a sidecar with a healthcheck",
            ),
        ],
    )
    out.append(case("bare job (schema, job_id, command)", line(bare), "accept"))
    out += bad(
        g,
        [
            ("job_id", "", "empty"),
            ("job_id", 12, "a number"),
            ("command", "", "empty"),
            ("command", [], "an empty list"),
            ("command", ["echo", 1], "with a number"),
            ("command", 5, "a number"),
            ("setup", "make", "a string"),
            ("setup", [""], "with an empty command"),
            ("env", {"A": 1}, "with a number value"),
            ("env", ["A=1"], "a list"),
            ("timeout_s", 0, "zero"),
            ("timeout_s", -5, "negative"),
            ("timeout_s", "600", "a string"),
            ("limits", 5, "a number"),
            ("limits.memory_mb", 0, "zero"),
            ("limits.memory_mb", "2048", "a string"),
            ("limits.pids", 1.5, "a fraction"),
            ("limits.cpus", -1, "negative"),
            ("network", "proxy", "a string"),
            ("network.policy", "open", "unknown value"),
            ("network.port", 70000, "out of range"),
            ("network.proxy_url", "ftp://x", "not http"),
            ("verify", "check.py", "a string"),
            ("verify.timeout_s", 0, "zero"),
            ("verify.reward_file", "/tmp/reward", "absolute"),
            ("verify.reward_file", "../reward", "outside the workspace"),
            ("verify.reset", ".verify", "a string"),
            ("verify.reset", ["../x"], "outside the workspace"),
            ("workspace.files", {"../evil": "x"}, "escaping the workspace"),
            ("workspace.files", {"a.txt": 5}, "with a number content"),
            ("collect", ["/etc/*"], "absolute"),
            ("collect", "output/*", "a string"),
            ("keep", "sometimes", "unknown value"),
            ("meta", ["s"], "a list"),
            ("image", 5, "a number"),
            ("workdir", "app", "relative"),
            ("workdir", "/etc/app", "a system directory"),
            ("profile", "lax", "unknown value"),
            ("mounts", [{"target": "tests"}], "with a relative target"),
            ("mounts", [{"files": {}}], "without a target"),
            ("mounts", {"target": "/x"}, "an object"),
            ("image_run", "RUN true", "a string"),
            ("image_env", {"PATH": 1}, "with a number"),
            ("services", {"name": "db", "image": "x"}, "an object"),
            ("services", [{"name": "db"}], "without an image"),
            ("services", [{"name": "Bad Name", "image": "x"}], "with a bad name"),
            (
                "services",
                [{"name": "db", "image": "x", "healthcheck": {}}],
                "a healthcheck without a command",
            ),
        ],
    )
    return out


def runs() -> list[dict]:
    g, infra = golden("run")
    out = common("run", g, "claw.job/v1", "duration_s")
    out += missing(g, ["job_id", "status", "started_at", "ended_at"])
    out += good(
        g,
        [
            ("verify", None, "null"),
            ("collected", _MISSING, "absent"),
            ("meta", _MISSING, "absent"),
            ("limits", {"memory_mb": 4096, "pids": 1024, "cpus": 2}, "enforced bounds"),
            ("verify.reward", None, "null"),
            ("verify.details", {"reward_file_error": "x"}, "with reward_file_error"),
            ("verify.details", {"no_reward": "the verifier timed out"}, "with no_reward"),
            ("status", "timeout", "timeout"),
        ],
    )
    out.append(case("infra_error run", line(infra), "accept"))
    out += bad(
        g,
        [
            ("job_id", "", "empty"),
            ("job_id", 3, "a number"),
            ("status", "done", "unknown value"),
            ("exit_code", "0", "a string"),
            ("exit_code", 0.5, "a fraction"),
            ("verify", "ok", "a string"),
            ("verify.reward", 1.5, "above 1"),
            ("verify.reward", -0.5, "below 0"),
            ("verify.reward", "1", "a string"),
            ("verify.passed", "yes", "a string"),
            ("verify.exit_code", "0", "a string"),
            ("verify.details", [1], "a list"),
            ("verify.timed_out", "no", "a string"),
            ("started_at", "x", "a string"),
            ("ended_at", -1, "negative"),
            ("attempts", 0, "zero"),
            ("meta", ["s"], "a list"),
            ("collected", {"a": 1}, "with a number"),
            ("error", 5, "a number"),
            ("stdout_tail", 5, "a number"),
            ("duration_s", -1, "negative"),
            ("backend", 1, "a number"),
        ],
    )
    return out


# -- session tokens ---------------------------------------------------------------------------

SECRET = "change-me"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _signed(msg: str, secret: str = SECRET) -> str:
    key = secret.strip().encode("utf-8")
    return f"{msg}.{_b64(hmac.new(key, msg.encode('utf-8'), hashlib.sha256).digest())}"


def tokens() -> list[dict]:
    tags = {"task": "hello", "harness": "claw-agent-chat"}
    blob = _b64(json.dumps(tags, separators=(",", ":"), sort_keys=True).encode("utf-8"))
    plain, tagged = _signed("s-3f2a"), _signed(f"s-3f2a.{blob}")

    def tok(name, token, verdict, session=None, tags=None, secret=SECRET):
        c = {"case": name, "secret": secret, "token": token, "verdict": verdict}
        if verdict == "accept":
            c.update(session=session, tags=tags or {})
        return c

    flipped = plain[:-3] + ("A" if plain[-3] != "A" else "B") + plain[-2:]
    return [
        tok("session only", plain, "accept", "s-3f2a"),
        tok("session and tags", tagged, "accept", "s-3f2a", tags),
        tok("secret file with a trailing newline", plain, "accept", "s-3f2a", secret=SECRET + "\n"),
        tok("128-character session", _signed("a" * 128), "accept", "a" * 128),
        tok("underscores and dashes", _signed("A_b-9"), "accept", "A_b-9"),
        tok("signature changed", flipped, "reject"),
        tok("another secret", plain, "reject", secret="other-secret"),
        tok("no signature", "s-3f2a", "reject"),
        tok("empty signature", "s-3f2a.", "reject"),
        tok("empty token", "", "reject"),
        tok("empty session", _signed(""), "reject"),
        tok("129-character session", _signed("a" * 129), "reject"),
        tok("space in the session", _signed("s 3f2a"), "reject"),
        tok("slash in the session", _signed("s/3f2a"), "reject"),
        tok("three parts before the signature", _signed(f"s-3f2a.{blob}.{blob}"), "reject"),
        tok("tags are a JSON list", _signed("s-3f2a." + _b64(b"[1,2]")), "reject"),
        tok("tags are not JSON", _signed("s-3f2a." + _b64(b"{not json")), "reject"),
        tok("tags are not base64url", _signed("s-3f2a.%%%"), "reject"),
        tok("padded signature", plain + "=", "reject"),
        tok("tags of another token", f"s-3f2a.{blob}.{plain.rsplit('.', 1)[1]}", "reject"),
        tok("non-ASCII session", _signed("s-3f2\u00e4"), "reject"),
    ]


# -- verifier reward file ---------------------------------------------------------------------


def rewards() -> list[dict]:
    def rw(name, text, verdict, reward=None, scores=None):
        c = {"case": name, "text": text, "verdict": verdict}
        if verdict == "accept":
            c.update(reward=reward, scores=scores or {})
        return c

    return [
        rw("one", "1", "accept", 1.0),
        rw("zero", "0", "accept", 0.0),
        rw("a fraction with a newline", "0.25\n", "accept", 0.25),
        rw("surrounding whitespace", "  1.0 \n", "accept", 1.0),
        rw("exponent", "5e-1", "accept", 0.5),
        rw("sub-scores", '{"a": 1, "b": 0.5}', "accept", 0.75, {"a": 1.0, "b": 0.5}),
        rw("one sub-score", '{"file_exists": 0.0}\n', "accept", 0.0, {"file_exists": 0.0}),
        rw("above 1", "1.5", "reject"),
        rw("below 0", "-0.1", "reject"),
        rw("NaN", "NaN", "reject"),
        rw("Infinity", "Infinity", "reject"),
        rw("boolean", "true", "reject"),
        rw("word", "yes", "reject"),
        rw("empty", "", "reject"),
        rw("only whitespace", " \n", "reject"),
        rw("a quoted number", '"0.5"', "reject"),
        rw("a list", "[0.5]", "reject"),
        rw("empty object", "{}", "reject"),
        rw("sub-score a string", '{"a": "x"}', "reject"),
        rw("sub-score a boolean", '{"a": true}', "reject"),
        rw("sub-score above 1", '{"a": 1.5}', "reject"),
        rw("sub-score NaN", '{"a": NaN}', "reject"),
        rw("nested object", '{"reward": 0.5, "scores": {"a": 0.5}}', "reject"),
        rw("two numbers", "0.5 0.5", "reject"),
    ]


# -- PPO values file ---------------------------------------------------------------------------


def values() -> list[dict]:
    g = {"sample_id": "grpo-0", "values": [0.1, 0.1, 0.2, 0.2, 0.3, 0.35, 0.4, 0.4, 0.4, 0.5, 0.6]}
    marked = line(changed(g, "values.4", 0.123456789))
    return [
        case("golden line", line(g), "accept"),
        case("unknown key", line({**g, "x_future": 1}), "accept"),
        case("empty values (an empty sample)", line({**g, "values": []}), "accept"),
        case("integers", line({**g, "values": [0] * 11}), "accept"),
        case("blank line", "  ", "skip"),
        case("not JSON (cut line)", line(g)[:30], "reject", None, "JSON"),
        case("JSON array, not an object", "[0.1, 0.2]", "reject", None, "object"),
        case("NaN value (not JSON)", marked.replace("0.123456789", "NaN"), "reject", None, "NaN"),
        case(
            "Infinity value (not JSON)",
            marked.replace("0.123456789", "Infinity"),
            "reject",
            None,
            "Infinity",
        ),
        *missing(g, ["sample_id", "values"]),
        *bad(
            g,
            [
                ("sample_id", "", "empty"),
                ("sample_id", 0, "a number"),
                ("values", "0.1", "a string"),
                ("values", [0.1, "x"], "with a string"),
                ("values", [0.1, None], "with null"),
                ("values", [[0.1]], "nested"),
            ],
        ),
    ]


FILES = {
    "claw.call.v1.jsonl": calls,
    "claw.outcome.v1.jsonl": outcomes,
    "claw.sample.v1.jsonl": samples,
    "claw.policy.v1.jsonl": policies,
    "claw.job.v1.jsonl": jobs,
    "claw.run.v1.jsonl": runs,
    "session-token.jsonl": tokens,
    "reward-file.jsonl": rewards,
    "values-file.jsonl": values,
}


def main() -> None:
    for name, make in FILES.items():
        cases = make()
        names = [c["case"] for c in cases]
        assert len(names) == len(set(names)), f"{name}: duplicate case names"
        text = "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in cases)
        (HERE / name).write_text(text, encoding="utf-8")
        print(f"{name}: {len(cases)} cases")


if __name__ == "__main__":
    main()
