"""The `claw-proxy` command line: a thin click group over the library."""

from __future__ import annotations

import json
import sys

import click

from claw_proxy import __version__
from claw_proxy._cli_admin import admin, parse_tags
from claw_proxy._serve_options import config_options
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
@config_options
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", default=8000, show_default=True, type=int, help="port to listen on")
@click.option(
    "--log-level",
    default="warning",
    show_default=True,
    help="server log level on stderr (debug, info, warning, error)",
)
def serve(host, port, log_level, **options):
    """Serve the OpenAI and Anthropic APIs on a policy engine, recording every call.

    Example:

        claw-proxy serve --engine transformers:tests/fixtures/tiny-qwen3 --port 8765
        --secret-file secret.txt --record calls.jsonl --route 'claude-haiku*=policy'

    Two vLLM replicas of one policy:

        claw-proxy serve --engine vllm:http://127.0.0.1:8001 --engine vllm:http://127.0.0.1:8002
        --tokenizer runs/tiny --secret-file secret.txt --record calls.jsonl

    An MoE policy served in bfloat16 while the learner trains in float32:

        claw-proxy serve --engine transformers:tests/fixtures/tiny-qwen3-moe --dtype bfloat16
        --secret-file secret.txt --record calls.jsonl
    """
    from claw_proxy._serve_options import config_from_options, engine_specs
    from claw_proxy.serve import serve as run

    if options["record"] is not None:
        _check_output(options["record"], "--record")
    specs = engine_specs(options)
    if not specs:
        raise _UsageLine("give the policy's engine: --engine SPEC (repeatable) or --replicas-file")
    try:
        run(
            config_from_options(options),
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

    parsed = parse_tags(tags)
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


main.add_command(admin)
