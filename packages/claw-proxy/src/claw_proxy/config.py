"""The proxy's configuration: one frozen record; `claw-proxy serve` flags map onto it."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import attrs

from claw_proxy._thinking import THINKING_POLICIES
from claw_proxy.errors import ConfigError

ENGINE_KINDS = ("transformers", "vllm", "scripted", "passthrough")
SAMPLING_POLICIES = ("force", "honor")
REPLICA_ROUTINGS = ("sticky", "random")
DRIFT_CHECKS = ("boundary", "full", "off")  # see render.Renderer
ENGINE_DTYPES = ("float32", "bfloat16", "float16")  # what transformers engines load a model in
GREEDY_BELOW = 1e-5  # temperatures below this sample greedily (vLLM's threshold too)


def split_spec(spec: str) -> tuple[str, str]:
    """`kind:target` of an engine spec, checked."""
    kind, sep, target = spec.partition(":")
    if not sep or kind not in ENGINE_KINDS or not target:
        raise ConfigError(
            f"bad engine spec {spec!r}: expected one of "
            + ", ".join(f"{k}:..." for k in ENGINE_KINDS)
        )
    return kind, target


def parse_route(text: str) -> tuple[str, str]:
    """`GLOB=ENGINE` (ENGINE is an engine spec, or `policy` for the main engine)."""
    glob, sep, spec = text.partition("=")
    if not sep or not glob or not spec:
        raise ConfigError(
            f"bad route {text!r}: expected GLOB=ENGINE, e.g. 'claude-haiku*=transformers:DIR'"
        )
    if spec != "policy":
        split_spec(spec)
    return glob, spec


def _f(help: str, default: Any = attrs.NOTHING, **cli: Any) -> Any:
    """A config field with the help text and the command-line shape of its `serve` flag.

    `cli` keys: `flag` (the flag when not --<name>), `type` (of a None default), `choices`,
    `min` / `min_open` (a lower bound, checked here and by the flag), `finite`, `kind`: how the flag's
    value becomes the field (`engines`: repeatable, the first is the policy's engine; `lines`:
    a file of engine specs; `file`: a secret file's text; `env`: an environment variable's
    value; `route`: repeatable GLOB=ENGINE), `metavar`."""
    return attrs.field(default=default, metadata={"help": help, **cli})


@attrs.frozen(kw_only=True)
class ProxyConfig:
    """Everything `claw-proxy serve` takes: each field is one flag, with this help and default
    (`claw_proxy._serve_options` makes the flags from these fields)."""

    engine: str = _f(
        "policy engine: transformers:DIR, vllm:URL, scripted:FILE, passthrough:URL; repeat it "
        "for replicas of the policy (sessions stick to one replica, new ones go to the least "
        "loaded)",
        kind="engines",
    )
    replicas: tuple[str, ...] = _f(
        "more policy replicas: one engine spec per line (# comments), after any --engine",
        (),
        flag="--replicas-file",
        kind="lines",
    )
    replica_routing: str = _f(
        "with replicas: sticky keeps a session on one replica (its prefix cache); random picks "
        "one per call (a baseline)",
        "sticky",
        choices=REPLICA_ROUTINGS,
    )
    secret: str = _f("HMAC key of session tokens", flag="--secret-file", kind="file")
    record: str | None = _f(
        "append claw.call/v1 records to this JSONL file (default: record nothing)", None, type=str
    )
    admin_token: str | None = _f(
        "enables /admin/* with this token (default: no admin API)",
        None,
        flag="--admin-token-file",
        kind="file",
    )
    routes: tuple[tuple[str, str], ...] = _f(
        "send requested model names matching GLOB to ENGINE (an engine spec or 'policy'); "
        "repeatable, the first match wins",
        (),
        flag="--route",
        kind="route",
        metavar="GLOB=ENGINE",
    )
    tokenizer: str | None = _f(
        "HF dir with tokenizer + chat template (needed for vllm/scripted; default: the "
        "transformers DIR)",
        None,
        type=str,
    )
    policy_name: str = _f(
        "policy name written into every call record (its version comes from the engine)", "policy"
    )
    parser: str = _f(
        "how sampled text becomes tool calls (hermes = Qwen3 <tool_call> JSON)",
        "hermes",
        flag="--tool-parser",
    )
    max_body_bytes: int = _f(
        "largest request body accepted; a larger one is refused (413)", 16 * 1024 * 1024, min=1
    )
    max_tokens_cap: int = _f("upper bound on any request's max tokens", 4096, min=1)
    default_max_tokens: int = _f("max tokens when a request does not say", 1024, min=1)
    sampling: str = _f(
        "force: sample every call at temperature 1, top_p 1, no top_k (on-policy for the "
        "learner); honor: use each request's temperature / top_p / top_k. Either way the records "
        "hold the settings used and the logprobs of the distribution sampled from",
        "force",
        choices=SAMPLING_POLICIES,
    )
    max_temperature: float = _f(
        "with --sampling honor: cap on a request's temperature", 2.0, min=0, finite=True
    )
    default_temperature: float = _f(
        "with --sampling honor: the temperature of a request that does not say",
        1.0,
        min=0,
        finite=True,
    )
    thinking: str = _f(
        "a harness's thinking switch (Anthropic thinking, chat reasoning_effort, Responses "
        "reasoning.effort) reaches the chat template as enable_thinking where it reads that; "
        "where it does not, record: serve the call and record the switch as not applied "
        "(sampling.thinking.applied false); refuse: answer 400",
        "record",
        choices=THINKING_POLICIES,
    )
    seed: int | None = _f(
        "a call whose request gives no seed samples with a seed derived from this one, its "
        "session and its seq (recorded as sampling.seed): a rerun draws the same tokens whatever "
        "order concurrent calls arrive in. Default: fresh random numbers",
        None,
        type=int,
    )
    session_concurrency: int = _f("requests in flight per session; more get 429", 8, min=1)
    request_timeout: float = _f("seconds for one generation", 600.0)
    record_max_bytes: int | None = _f(
        "shard the records by size (default: one file until rotated)", None, type=int
    )
    record_fsync: bool = _f(
        "fsync every record (power-loss safety; kill -9 safety needs only the write)",
        False,
        flag="--fsync",
    )
    record_bodies: bool = _f("keep raw requests and answers in the records", False)
    drift_check_tokens: int = _f(
        "full re-renders to check tokenization drift only for prompts up to this many tokens "
        "(0: never)",
        16384,
    )
    drift_check: str = _f(
        "how a prompt built by prefix reuse is checked against a re-render (prefix."
        "fresh_render_matches): boundary re-renders only the reused answer and the new messages "
        "(cost grows with the new tokens, not the context); full re-renders the whole request",
        "boundary",
        choices=DRIFT_CHECKS,
    )
    drift_full_every: int = _f(
        "with --drift-check boundary, also re-render every Nth reused prompt in full (0: never)",
        0,
        min=0,
    )
    batch_wait: float = _f("transformers engine: seconds to gather a batch", 0.005)
    max_batch: int = _f("transformers engine: rows per batch", 16)
    dtype: str = _f(
        "transformers engines: the dtype the model is loaded and served in (also the weights "
        "each policy update loads); e.g. bfloat16 serves the policy as GPU engines do while "
        "the learner trains in float32, the numeric difference MoE routing replay guards "
        "against. A vLLM server's dtype is set where vLLM starts",
        "float32",
        choices=ENGINE_DTYPES,
    )
    upstream_api_key: str | None = _f(
        "environment variable holding a passthrough upstream key",
        None,
        flag="--upstream-key-env",
        kind="env",
    )
    student_ids: bool = _f(
        "passthrough engines are teachers: record each call in the student's tokenization "
        "(--tokenizer: prompt as its chat template renders it, the teacher's answer as the "
        "template writes it), trainable, marked teacher: passthrough; logprobs are 0.0 "
        "placeholders",
        False,
    )
    vllm_reload_method: str = _f(
        "vllm engines: /collective_rpc method that loads a new policy's weights", "reload_weights"
    )
    # --- hardening: limits on what one client can make the proxy hold or do
    max_prompt_tokens: int = _f(
        "a request whose rendered prompt is longer gets 413 (before rendering when its "
        "message text alone proves it: see the README)",
        262144,
        min=1,
    )
    prefix_cache_bytes: int = _f(
        "memory for prefix reuse (per tokenizer); the coldest sessions are evicted past it",
        1 << 30,
        min=1,
    )
    cpu_workers: int = _f(
        "threads that parse, render and tokenise requests off the event loop", 4, min=1
    )
    header_timeout: float = _f(
        "seconds a connection has to send a request's headers", 10.0, min=0, min_open=True
    )
    body_timeout: float = _f(
        "seconds a request body may go without a byte (then 408)", 60.0, min=0, min_open=True
    )
    max_connections: int = _f(
        "open connections; past it the one waiting longest for its headers is closed",
        1000,
        min=1,
    )

    def __attrs_post_init__(self) -> None:
        self._check_engines()
        for f in attrs.fields(type(self)):
            _check_field(f, getattr(self, f.name))
        from claw_proxy.toolparse import PARSERS

        if self.parser not in PARSERS:
            raise ConfigError(f"unknown tool-call parser {self.parser!r}; known: {sorted(PARSERS)}")

    def _check_engines(self) -> None:
        """The engine specs: each well formed, the policy's replicas distinct and not
        passthrough endpoints."""
        split_spec(self.engine)
        for spec in self.replicas:
            if split_spec(spec)[0] == "passthrough":
                raise ConfigError(f"replica {spec}: a passthrough endpoint cannot serve the policy")
        if self.replicas and split_spec(self.engine)[0] == "passthrough":
            raise ConfigError("replicas serve the policy: the first engine cannot be passthrough")
        if len({self.engine, *self.replicas}) != 1 + len(self.replicas):
            raise ConfigError("an engine is named twice among the replicas")
        for _glob, spec in self.routes:
            if spec != "policy":
                split_spec(spec)
        if self.dtype != "float32":
            specs = [self.engine, *self.replicas, *(s for _, s in self.routes if s != "policy")]
            if not any(split_spec(s)[0] == "transformers" for s in specs):
                raise ConfigError(
                    f"dtype {self.dtype} applies only to transformers: engines, and none is "
                    f"served here ({', '.join(specs)}); a vLLM server's dtype is its own "
                    "--dtype, set where vLLM starts"
                )


def _check_field(f: attrs.Attribute, value: Any) -> None:
    """A field's value against its metadata: one of its `choices`, at or above its `min`."""
    choices = f.metadata.get("choices")
    if choices and value not in choices:
        raise ConfigError(f"{f.name} must be one of {', '.join(choices)}, got {value!r}")
    low = f.metadata.get("min")
    if low is None or value is None:
        return
    if isinstance(value, float) and (
        math.isnan(value) or (f.metadata.get("finite") and math.isinf(value))
    ):
        raise ConfigError(f"{f.name} must be a finite number, got {value!r}")
    if value < low or (f.metadata.get("min_open") and value == low):
        bound = f"> {low}" if f.metadata.get("min_open") else f">= {low}"
        raise ConfigError(f"{f.name} must be {bound}, got {value!r}")


def call_seed(seed: int, session: str, seq: int) -> int:
    """The sampling seed of call `seq` of `session` under the proxy's `seed`: a fixed function of
    the three, so a call draws the same random numbers whichever calls run beside it or arrive
    first (concurrent rollouts share one engine; a shared generator would hand out its numbers
    in arrival order). 63 bits, valid for torch.Generator.manual_seed and vLLM."""
    digest = hashlib.sha256(f"{seed}\x00{session}\x00{seq}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def resolve_sampling(config: ProxyConfig, asked) -> tuple[float, float, int, bool]:
    """(temperature, top_p, top_k, forced) a call samples with, from the request's `asked`
    settings (`messages.Sampling`, None = not given) under the proxy's sampling policy.

    ``force``: temperature 1, top_p 1, top_k 0 (off) whatever was asked; `forced` is true when
    the request asked for anything else. ``honor``: the request's settings, the temperature
    defaulted and capped by the config. A temperature below `GREEDY_BELOW` is greedy: 0.0, with
    top_p 1 and top_k 0.
    """
    if config.sampling == "force":
        forced = (
            asked.temperature not in (None, 1.0)
            or asked.top_p not in (None, 1.0)
            or asked.top_k not in (None, 0)
        )
        return 1.0, 1.0, 0, forced
    t = config.default_temperature if asked.temperature is None else asked.temperature
    t = min(t, config.max_temperature)
    if t < GREEDY_BELOW:
        return 0.0, 1.0, 0, False  # greedy: top_p / top_k change nothing (vLLM resets them too)
    top_p = 1.0 if asked.top_p is None else asked.top_p
    return float(t), float(top_p), asked.top_k or 0, False
