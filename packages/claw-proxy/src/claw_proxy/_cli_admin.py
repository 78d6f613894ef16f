"""`claw-proxy admin ...`: the admin API from the shell, one command per route (AdminClient)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import click

from claw_proxy.errors import ClawError

if TYPE_CHECKING:
    from claw_proxy.admin import AdminClient

URL_ENV = "CLAW_PROXY_URL"
TOKEN_ENV = "CLAW_PROXY_ADMIN_TOKEN_FILE"


def _connection(fn):
    """The options every admin command takes: where the proxy is, and its admin token."""
    fn = click.option(
        "--admin-token-file",
        envvar=TOKEN_ENV,
        required=True,
        type=click.Path(exists=True, dir_okay=False),
        help=f"the file `serve --admin-token-file` was given (env {TOKEN_ENV})",
    )(fn)
    return click.option(
        "--url",
        envvar=URL_ENV,
        default="http://127.0.0.1:8000",
        show_default=True,
        help=f"the proxy's base URL (env {URL_ENV})",
    )(fn)


def parse_tags(tags: tuple[str, ...], option: str = "--tag") -> dict[str, str]:
    """`KEY=VALUE` options as a dict; another shape is a usage error of `option`."""
    parsed = {}
    for t in tags:
        k, sep, v = t.partition("=")
        if not sep or not k:
            raise click.BadParameter(f"{t!r} is not KEY=VALUE", param_hint=option)
        parsed[k] = v
    return parsed


def _run(url: str, token_file: str, call: Callable[[AdminClient], Iterable[dict | None]]) -> None:
    """Print each answer `call` gets from the proxy's admin API as one JSON line; a refusal
    (or an unreadable token or policy file) is one error with a hint."""
    from claw_proxy.admin import AdminClient
    from claw_proxy.tokens import read_secret

    try:
        with AdminClient(url, read_secret(token_file)) as client:
            for answer in call(client):
                click.echo(json.dumps(answer, separators=(",", ":"), ensure_ascii=False))
    except ClawError as e:
        raise click.ClickException(
            f"{e}\nhint: check --url and --admin-token-file (the proxy's own --admin-token-file)"
        ) from e


@click.group()
def admin() -> None:
    """Drive a running proxy's admin API: reload, rotate, stats, close, session.

    Each command prints the proxy's JSON answer on one line. The routes are in the README
    (Admin API).
    """


@admin.command()
@click.argument("policy", type=click.Path(dir_okay=False, allow_dash=True))
@_connection
def reload(policy, url, admin_token_file):
    """Serve a new policy: a JSONL file of claw.policy/v1 records (the last one: claw-rl's
    policies.jsonl or its `train` output) or one JSON object, `-` for stdin.

    Example:

        claw-proxy admin reload runs/r1/policies.jsonl --admin-token-file admin.txt
    """
    from claw_proxy.admin import policy_from_text, read_policy

    def load(client: AdminClient) -> list[dict]:
        text = sys.stdin.read() if policy == "-" else None
        record = read_policy(policy) if text is None else policy_from_text(text, "<stdin>")
        return [client.reload(record)]

    _run(url, admin_token_file, load)


@admin.command()
@_connection
def rotate(url, admin_token_file):
    """Close the open record shard; prints the shards closed since the last rotation.

    Example:

        claw-proxy admin rotate --admin-token-file admin.txt | jq -r '.closed[]' | xargs claw-tree build
    """
    _run(url, admin_token_file, lambda client: [client.rotate()])


@admin.command()
@_connection
def stats(url, admin_token_file):
    """Print the proxy's counters (calls, sessions, policy, engines, caches) as JSON.

    Example:

        claw-proxy admin stats --url http://127.0.0.1:8765 --admin-token-file admin.txt
    """
    _run(url, admin_token_file, lambda client: [client.stats()])


@admin.command()
@click.argument("sessions", nargs=-1, required=True)
@click.option(
    "--missing-ok",
    is_flag=True,
    help="a session no call of which reached this proxy is skipped, not an error",
)
@_connection
def close(sessions, missing_ok, url, admin_token_file):
    """Close finished sessions (later calls get 401) and free their prefix caches; one JSON line
    per session (null for a skipped one).

    Example:

        claw-proxy admin close run1-task3 run1-task4 --missing-ok --admin-token-file admin.txt
    """
    _run(
        url,
        admin_token_file,
        lambda client: (client.close_session(s, missing_ok=missing_ok) for s in sessions),
    )


@admin.command()
@click.argument("session_id", metavar="SESSION")
@click.option(
    "--tag",
    "tags",
    multiple=True,
    metavar="KEY=VALUE",
    help="merge this tag into the session's tags (recorded in its later calls); repeatable",
)
@_connection
def session(session_id, tags, url, admin_token_file):
    """Print a session's state (tags, calls, in flight, closed), after merging any --tag.

    Example:

        claw-proxy admin session run1-task3 --tag task=t3 --admin-token-file admin.txt
    """
    parsed = parse_tags(tags)

    def show(client: AdminClient) -> list[dict]:
        return [client.tag_session(session_id, parsed) if parsed else client.session(session_id)]

    _run(url, admin_token_file, show)
