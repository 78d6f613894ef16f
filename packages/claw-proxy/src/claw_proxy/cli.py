"""The `claw-proxy` command line: a thin click group over the library."""

from __future__ import annotations

import json
import sys

import click

from claw_proxy import __version__
from claw_proxy.errors import ClawError


def _fail(e: ClawError, hint: str | None = None) -> click.ClickException:
    return click.ClickException(f"{e}" + (f"\nhint: {hint}" if hint else ""))


class _UsageLine(click.ClickException):
    """A mistake in the command line: one line on stderr, exit status 2."""

    exit_code = 2


def _check_output(path: str, option: str) -> None:
    """An output file's path, checked before any work: not a directory, in one that exists."""
    from pathlib import Path

    p = Path(path)
    if p.is_dir():
        raise _UsageLine(
            f"{option} {path}: is a directory; give a file path, e.g. {p / 'calls.jsonl'}"
        )
    if not p.parent.is_dir():
        raise _UsageLine(f"{option} {path}: the directory {p.parent} does not exist")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="claw-proxy")
def main() -> None:
    """claw-proxy: the model-boundary proxy. See `claw-proxy COMMAND --help`."""


@main.command()
@click.option(
    "--engine",
    "engines",
    multiple=True,
    help="policy engine: transformers:DIR, vllm:URL, scripted:FILE, passthrough:URL; repeat it "
    "for replicas of the policy (sessions stick to one replica, new ones go to the least loaded)",
)
@click.option(
    "--replicas-file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="more policy replicas: one engine spec per line (# comments), after any --engine",
)
@click.option(
    "--replica-routing",
    type=click.Choice(["sticky", "random"]),
    default="sticky",
    show_default=True,
    help="with replicas: sticky keeps a session on one replica (its prefix cache); random picks "
    "one per call (a baseline)",
)
@click.option(
    "--secret-file",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="HMAC key of session tokens",
)
@click.option("--record", default=None, help="append claw.call/v1 records to this JSONL file")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", default=8000, show_default=True, type=int, help="port to listen on")
@click.option(
    "--admin-token-file",
    type=click.Path(exists=True, dir_okay=False),
    help="enables /admin/* with this token",
)
@click.option(
    "--route",
    "routes",
    multiple=True,
    metavar="GLOB=ENGINE",
    help="send requested model names matching GLOB to ENGINE (an engine spec or 'policy'); repeatable",
)
@click.option(
    "--tokenizer",
    default=None,
    help="HF dir with tokenizer + chat template (needed for vllm/scripted)",
)
@click.option(
    "--policy-name",
    default="policy",
    show_default=True,
    help="policy name written into every call record (its version comes from the engine)",
)
@click.option(
    "--max-tokens-cap",
    default=4096,
    show_default=True,
    type=int,
    help="upper bound on any request's max tokens",
)
@click.option(
    "--default-max-tokens",
    default=1024,
    show_default=True,
    type=int,
    help="max tokens when a request does not say",
)
@click.option(
    "--max-body-bytes",
    default=16 * 1024 * 1024,
    show_default=True,
    type=int,
    help="largest request body accepted; a larger one is refused",
)
@click.option(
    "--session-concurrency",
    default=8,
    show_default=True,
    type=int,
    help="requests in flight per session; more get 429",
)
@click.option(
    "--request-timeout",
    default=600.0,
    show_default=True,
    type=float,
    help="seconds for one generation",
)
@click.option("--record-max-bytes", default=None, type=int, help="shard the records by size")
@click.option("--fsync/--no-fsync", default=False, show_default=True, help="fsync every record")
@click.option(
    "--record-bodies/--no-record-bodies",
    default=False,
    show_default=True,
    help="keep raw requests and answers in the records",
)
@click.option(
    "--drift-check-tokens",
    default=16384,
    show_default=True,
    type=int,
    help="full re-renders to check tokenization drift only for prompts up to this many tokens "
    "(0: never)",
)
@click.option(
    "--drift-check",
    type=click.Choice(["boundary", "full", "off"]),
    default="boundary",
    show_default=True,
    help="how a prompt built by prefix reuse is checked against a re-render (prefix."
    "fresh_render_matches): boundary re-renders only the reused answer and the new messages "
    "(cost grows with the new tokens, not the context); full re-renders the whole request",
)
@click.option(
    "--drift-full-every",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="with --drift-check boundary, also re-render every Nth reused prompt in full (0: never)",
)
@click.option(
    "--upstream-key-env",
    default=None,
    help="environment variable holding a passthrough upstream key",
)
@click.option(
    "--student-ids/--no-student-ids",
    default=False,
    show_default=True,
    help="passthrough engines are teachers: record each call in the student's tokenization "
    "(--tokenizer: prompt as its chat template renders it, the teacher's answer as the template "
    "writes it), trainable, marked teacher: passthrough; logprobs are 0.0 placeholders",
)
@click.option(
    "--tool-parser",
    default="hermes",
    show_default=True,
    help="how sampled text becomes tool calls (hermes = Qwen3 <tool_call> JSON)",
)
@click.option(
    "--max-batch",
    default=16,
    show_default=True,
    type=int,
    help="transformers engine: rows per batch",
)
@click.option(
    "--batch-wait",
    default=0.005,
    show_default=True,
    type=float,
    help="transformers engine: seconds to gather a batch",
)
@click.option(
    "--vllm-reload-method",
    default="reload_weights",
    show_default=True,
    help="vllm engines: /collective_rpc method that loads a new policy's weights",
)
@click.option(
    "--sampling",
    type=click.Choice(["force", "honor"]),
    default="force",
    show_default=True,
    help="force: sample every call at temperature 1, top_p 1, no top_k (on-policy for the "
    "learner); honor: use each request's temperature / top_p / top_k. Either way the records "
    "hold the settings used and the logprobs of the distribution sampled from",
)
@click.option(
    "--thinking",
    type=click.Choice(["record", "refuse"]),
    default="record",
    show_default=True,
    help="a harness's thinking switch (Anthropic thinking, chat reasoning_effort, Responses "
    "reasoning.effort) reaches the chat template as enable_thinking where it reads that; where "
    "it does not, record: serve the call and record the switch as not applied "
    "(sampling.thinking.applied false); refuse: answer 400",
)
@click.option(
    "--seed",
    type=int,
    default=None,
    help="a call whose request gives no seed samples with a seed derived from this one, its "
    "session and its seq (recorded as sampling.seed): a rerun draws the same tokens whatever "
    "order concurrent calls arrive in. Default: fresh random numbers",
)
@click.option(
    "--max-prompt-tokens",
    default=262144,
    show_default=True,
    type=click.IntRange(1),
    help="a request whose rendered prompt is longer gets 413 (before rendering when its "
    "message text alone proves it: see the README)",
)
@click.option(
    "--prefix-cache-bytes",
    default=1 << 30,
    show_default=True,
    type=click.IntRange(1),
    help="memory for prefix reuse (per tokenizer); the coldest sessions are evicted past it",
)
@click.option(
    "--cpu-workers",
    default=4,
    show_default=True,
    type=click.IntRange(1),
    help="threads that parse, render and tokenise requests off the event loop",
)
@click.option(
    "--header-timeout",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="seconds a connection has to send a request's headers",
)
@click.option(
    "--body-timeout",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="seconds a request body may go without a byte (then 408)",
)
@click.option(
    "--max-connections",
    default=1000,
    show_default=True,
    type=click.IntRange(1),
    help="open connections; past it the one waiting longest for its headers is closed",
)
@click.option(
    "--log-level",
    default="warning",
    show_default=True,
    help="server log level on stderr (debug, info, warning, error)",
)
def serve(
    engines,
    replicas_file,
    replica_routing,
    secret_file,
    record,
    host,
    port,
    admin_token_file,
    routes,
    tokenizer,
    policy_name,
    max_tokens_cap,
    default_max_tokens,
    max_body_bytes,
    session_concurrency,
    request_timeout,
    record_max_bytes,
    fsync,
    record_bodies,
    drift_check_tokens,
    drift_check,
    drift_full_every,
    upstream_key_env,
    student_ids,
    tool_parser,
    max_batch,
    batch_wait,
    vllm_reload_method,
    sampling,
    thinking,
    seed,
    max_prompt_tokens,
    prefix_cache_bytes,
    cpu_workers,
    header_timeout,
    body_timeout,
    max_connections,
    log_level,
):
    """Serve the OpenAI and Anthropic APIs on a policy engine, recording every call.

    Example:

        claw-proxy serve --engine transformers:tests/fixtures/tiny-qwen3 --port 8765
        --secret-file secret.txt --record calls.jsonl --route 'claude-haiku*=policy'

    Two vLLM replicas of one policy:

        claw-proxy serve --engine vllm:http://127.0.0.1:8001 --engine vllm:http://127.0.0.1:8002
        --tokenizer runs/tiny --secret-file secret.txt --record calls.jsonl
    """
    import os

    if record is not None:
        _check_output(record, "--record")
    specs = list(engines)
    if replicas_file:
        from pathlib import Path

        for line in Path(replicas_file).read_text(encoding="utf-8").splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                specs.append(line)
    if not specs:
        raise _UsageLine("give the policy's engine: --engine SPEC (repeatable) or --replicas-file")
    engine = specs[0]
    from claw_proxy.config import ProxyConfig, parse_route
    from claw_proxy.serve import serve as run
    from claw_proxy.tokens import read_secret

    try:
        config = ProxyConfig(
            engine=engine,
            replicas=tuple(specs[1:]),
            replica_routing=replica_routing,
            secret=read_secret(secret_file),
            record=record,
            admin_token=read_secret(admin_token_file) if admin_token_file else None,
            routes=tuple(parse_route(r) for r in routes),
            tokenizer=tokenizer,
            policy_name=policy_name,
            max_tokens_cap=max_tokens_cap,
            default_max_tokens=default_max_tokens,
            max_body_bytes=max_body_bytes,
            session_concurrency=session_concurrency,
            request_timeout=request_timeout,
            record_max_bytes=record_max_bytes,
            record_fsync=fsync,
            record_bodies=record_bodies,
            drift_check_tokens=drift_check_tokens,
            drift_check=drift_check,
            drift_full_every=drift_full_every,
            upstream_api_key=os.environ.get(upstream_key_env) if upstream_key_env else None,
            student_ids=student_ids,
            parser=tool_parser,
            max_batch=max_batch,
            batch_wait=batch_wait,
            vllm_reload_method=vllm_reload_method,
            sampling=sampling,
            thinking=thinking,
            seed=seed,
            max_prompt_tokens=max_prompt_tokens,
            prefix_cache_bytes=prefix_cache_bytes,
            cpu_workers=cpu_workers,
            header_timeout=header_timeout,
            body_timeout=body_timeout,
            max_connections=max_connections,
        )
        run(
            config,
            host=host,
            port=port,
            log_level=log_level,
            announce=lambda url: click.echo(
                f"claw-proxy: serving {' + '.join(specs)} on {url}", err=True
            ),
        )
    except ClawError as e:
        raise _fail(e, "check the engine spec, the tokenizer directory and the secret file") from e


@main.command()
@click.argument("session")
@click.option(
    "--secret-file",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="HMAC key of session tokens (the proxy's --secret-file)",
)
@click.option(
    "--tag",
    "tags",
    multiple=True,
    metavar="KEY=VALUE",
    help="session tag carried in the token; repeatable",
)
def token(session, secret_file, tags):
    """Print a signed session token (the API key a harness sends for one rollout).

    Example:

        ANTHROPIC_API_KEY=$(claw-proxy token run1-task3 --secret-file secret.txt --tag task=t3 --tag harness=claude-code)
    """
    from claw_proxy.tokens import mint_token, read_secret

    parsed = {}
    for t in tags:
        k, sep, v = t.partition("=")
        if not sep or not k:
            raise click.BadParameter(f"{t!r} is not KEY=VALUE", param_hint="--tag")
        parsed[k] = v
    try:
        click.echo(mint_token(session, read_secret(secret_file), parsed or None))
    except ClawError as e:
        raise _fail(e) from e


@main.command()
@click.argument("path", type=click.Path())
@click.option("--follow", "-f", is_flag=True, help="keep printing calls as they are appended")
@click.option("--summary", is_flag=True, help="one short line per call instead of the record")
def calls(path, follow, summary):
    """Print the claw.call/v1 records of a record file (and its shards), checked, as JSONL.

    Example:

        claw-proxy calls calls.jsonl --follow | claw-tree build
    """
    from claw_proxy.records import follow_calls, read_calls

    try:
        it = follow_calls(path) if follow else read_calls(path)
        for c in it:
            if summary:
                line = (
                    f"{c.session}\t{c.seq}\t{c.api}\t{c.model}\tv{c.policy.get('version')}\t"
                    f"{len(c.prompt_ids)}+{len(c.completion_ids)}\t{c.finish_reason}"
                )
            else:
                line = json.dumps(c.to_dict(), separators=(",", ":"), ensure_ascii=False)
            click.echo(line)
            if follow:
                sys.stdout.flush()
    except ClawError as e:
        raise _fail(e) from e
    except KeyboardInterrupt:
        pass


@main.command()
@click.argument("request_file", type=click.File("r"), default="-")
@click.option("--tokenizer", required=True, help="HF dir with the tokenizer and chat template")
@click.option(
    "--api",
    type=click.Choice(["openai.chat", "openai.responses", "anthropic.messages", "auto"]),
    default="auto",
    show_default=True,
    help="API of the request body (auto: from the captured path, else from its fields)",
)
def render(request_file, tokenizer, api):
    """Render one API request body (or a captured {path, body}) into prompt token ids, as the proxy would.

    Example:

        claw-proxy render tests/fixtures/harness-requests/claude-code-1.json --tokenizer tests/fixtures/tiny-qwen3
    """
    from claw_proxy import api_anthropic, api_chat, api_responses
    from claw_proxy.render import Renderer

    try:
        data = json.load(request_file)
    except json.JSONDecodeError as e:
        raise click.ClickException(
            f"{request_file.name}: invalid JSON at line {e.lineno}: {e.msg}"
        ) from e
    path = data.get("path", "") if isinstance(data, dict) else ""
    body = data.get("body", data) if isinstance(data, dict) else data
    if api == "auto":
        api = (
            "anthropic.messages"
            if "/messages" in path or "max_tokens" in body and "system" in body
            else "openai.responses"
            if "/responses" in path or "input" in body
            else "openai.chat"
        )
    mod = {
        "openai.chat": api_chat,
        "openai.responses": api_responses,
        "anthropic.messages": api_anthropic,
    }[api]
    try:
        req = mod.parse(body)
        ids = Renderer(tokenizer).render_full(req)
    except ClawError as e:
        raise _fail(e) from e
    click.echo(
        json.dumps(
            {
                "api": api,
                "model": req.model,
                "messages": len(req.messages),
                "tools": len(req.tools),
                "prompt_ids": ids,
            }
        )
    )
