"""The proxy's configuration: one frozen record; `claw-proxy serve` flags map onto it."""

from __future__ import annotations

import hashlib
import math

import attrs

from claw_proxy.errors import ConfigError

ENGINE_KINDS = ("transformers", "vllm", "scripted", "passthrough")
SAMPLING_POLICIES = ("force", "honor")
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


@attrs.frozen(kw_only=True)
class ProxyConfig:
    """Everything `claw-proxy serve` takes."""

    engine: str  # the policy's engine spec; unmatched model names go here
    replicas: tuple[str, ...] = ()  # more engines serving the policy (sticky sessions)
    replica_routing: str = "sticky"  # sticky: a session stays on one replica; random: per call
    secret: str  # HMAC key of session tokens
    record: str | None = None  # claw.call/v1 JSONL path (None: record nothing)
    admin_token: str | None = None  # enables /admin/*
    routes: tuple[
        tuple[str, str], ...
    ] = ()  # (model glob, engine spec or "policy"), first match wins
    tokenizer: str | None = (
        None  # HF dir with the tokenizer + chat template (default: the transformers DIR)
    )
    policy_name: str = "policy"
    parser: str = "hermes"  # tool-call parser
    max_body_bytes: int = 16 * 1024 * 1024
    max_tokens_cap: int = 4096  # upper bound on any request's max tokens
    default_max_tokens: int = 1024  # when a request does not say
    sampling: str = "force"  # force: T 1, top_p 1, no top_k for every call; honor: the request's
    max_temperature: float = 2.0  # honor: cap on a request's temperature
    default_temperature: float = 1.0  # honor: when a request does not say
    # a harness's thinking switch where the chat template has none (no enable_thinking):
    # record: served and recorded as not applied; refuse: 400
    thinking: str = "record"
    seed: int | None = (
        None  # a call whose request gives no seed samples with call_seed(seed, session, seq)
    )
    session_concurrency: int = 8  # requests in flight per session; more get 429
    request_timeout: float = 600.0  # seconds for one generation
    record_max_bytes: int | None = None  # shard the records by size
    record_fsync: bool = (
        False  # fsync each record (power-loss safety; kill -9 safety needs only the write)
    )
    record_bodies: bool = False  # keep the raw request and the answer in each record
    drift_check_tokens: int = (
        16384  # full re-renders (drift checks) only for prompts up to this many tokens
    )
    # boundary: re-render only the reused answer and the new messages (O(new tokens));
    # full: re-render the whole request; off: no check
    drift_check: str = "boundary"
    drift_full_every: int = 0  # boundary mode: a full re-render every Nth reuse too (0: never)
    batch_wait: float = 0.005  # transformers engine: seconds to gather a batch
    max_batch: int = 16
    upstream_api_key: str | None = None  # passthrough engines' key for the real endpoint
    # passthrough engines: record calls in the student's tokenization (`tokenizer`), trainable
    student_ids: bool = False
    vllm_reload_method: str = (
        "reload_weights"  # vllm engines: /collective_rpc method for new weights
    )
    # --- hardening: limits on what one client can make the proxy hold or do
    max_prompt_tokens: int = 262144  # a longer rendered prompt gets 413
    prefix_cache_bytes: int = 1 << 30  # prefix-cache budget; cold sessions are evicted past it
    cpu_workers: int = 4  # threads that parse, render and tokenise off the event loop
    header_timeout: float = 10.0  # seconds for a connection to send a request's headers
    body_timeout: float = 60.0  # seconds the body of a request may go without a byte (408)
    max_connections: int = 1000  # open connections; past it the oldest idle one is closed

    def __attrs_post_init__(self) -> None:
        split_spec(self.engine)
        for spec in self.replicas:
            if split_spec(spec)[0] == "passthrough":
                raise ConfigError(f"replica {spec}: a passthrough endpoint cannot serve the policy")
        if self.replicas and split_spec(self.engine)[0] == "passthrough":
            raise ConfigError("replicas serve the policy: the first engine cannot be passthrough")
        if len({self.engine, *self.replicas}) != 1 + len(self.replicas):
            raise ConfigError("an engine is named twice among the replicas")
        if self.replica_routing not in ("sticky", "random"):
            raise ConfigError(
                f"replica_routing must be 'sticky' or 'random', got {self.replica_routing!r}"
            )
        for _glob, spec in self.routes:
            if spec != "policy":
                split_spec(spec)
        if self.max_tokens_cap < 1 or self.default_max_tokens < 1:
            raise ConfigError("max token limits must be >= 1")
        if self.session_concurrency < 1:
            raise ConfigError("session_concurrency must be >= 1")
        for name in ("max_prompt_tokens", "prefix_cache_bytes", "cpu_workers", "max_connections"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1")
        if not (self.header_timeout > 0 and self.body_timeout > 0):
            raise ConfigError("header_timeout and body_timeout must be > 0 seconds")
        from claw_proxy.render import DRIFT_CHECKS

        if self.drift_check not in DRIFT_CHECKS:
            raise ConfigError(
                f"drift_check must be one of {', '.join(DRIFT_CHECKS)}, got {self.drift_check!r}"
            )
        if self.drift_full_every < 0:
            raise ConfigError("drift_full_every must be >= 0")
        if self.sampling not in SAMPLING_POLICIES:
            raise ConfigError(f"sampling must be one of {SAMPLING_POLICIES}, got {self.sampling!r}")
        from claw_proxy._thinking import THINKING_POLICIES

        if self.thinking not in THINKING_POLICIES:
            raise ConfigError(f"thinking must be one of {THINKING_POLICIES}, got {self.thinking!r}")
        for name in ("max_temperature", "default_temperature"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")
        from claw_proxy.toolparse import PARSERS

        if self.parser not in PARSERS:
            raise ConfigError(f"unknown tool-call parser {self.parser!r}; known: {sorted(PARSERS)}")


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
