"""claw-agent: a small reference agent that claw-bench runs when no external harness is installed.

Run in the task's workspace (cwd) as ``python -m claw_bench.agent --api chat|anthropic ...``.
It sends the instruction and three tools (bash, read_file, write_file) to an OpenAI chat
completions endpoint ($OPENAI_BASE_URL, key $OPENAI_API_KEY) or an Anthropic Messages one
($ANTHROPIC_BASE_URL, key $ANTHROPIC_API_KEY), runs the tool calls it gets back, returns their
results, and stops when the model answers without a (well-formed) tool call or after
--max-turns (said on stderr). Exit 0 in both cases; 2 when the endpoint fails. The final text
answer is written to --answer-file when given. With --no-tools it sends no tool definitions.

It speaks HTTP with the standard library only (http.client, one kept-alive connection): the
agent starts once per rollout, and importing httpx cost it ~0.1 CPU-s, as much as a toy
rollout's model calls.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

SYSTEM = (
    "You are an agent working in a directory of files. Use the tools to inspect and change "
    "files. When the task is done, answer with a short summary and no tool call."
)
_PARAMS = {
    "bash": (
        {"command": {"type": "string", "description": "bash command, run in the workspace"}},
        "Run a bash command in the workspace; returns exit code, stdout and stderr.",
    ),
    "read_file": (
        {"path": {"type": "string", "description": "workspace-relative path"}},
        "Read a text file of the workspace.",
    ),
    "write_file": (
        {"path": {"type": "string"}, "content": {"type": "string"}},
        "Write (create or replace) a text file in the workspace.",
    ),
}
_LIMIT = 20000

#: ``post(path, body) -> answer``: one model request (path below the base URL, JSON body)
Post = Callable[[str, dict[str, Any]], Any]


class EndpointError(Exception):
    """The endpoint answered with an HTTP error status, or not at all."""


class Endpoint:
    """POST JSON to ``base_url + path`` over one kept-alive HTTP(S) connection.

    A refused connection is retried up to ``retries`` times, waiting 0.1, 0.2, 0.4, ... s (the
    proxy may still be starting); a kept-alive connection the server has closed is reopened
    once. An HTTP status >= 400 is an EndpointError.
    """

    def __init__(
        self, base_url: str, headers: dict[str, str], timeout: float, retries: int = 5
    ) -> None:
        url = urlsplit(base_url.rstrip("/"))
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"base URL {base_url!r}: expected http(s)://host[:port][/path]")
        kind = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        self.conn = kind(url.hostname, url.port, timeout=timeout)
        self.prefix = url.path
        self.headers = {**headers, "content-type": "application/json", "accept": "application/json"}
        self.retries = retries

    def __call__(self, path: str, body: dict[str, Any]) -> Any:
        # as httpx's json= wrote it: UTF-8, compact, no NaN
        text = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        data = text.encode()
        refused = 0
        while True:
            reused = self.conn.sock is not None
            try:
                self.conn.request("POST", self.prefix + path, data, self.headers)
                r = self.conn.getresponse()
                raw = r.read()
                break
            except ConnectionRefusedError as exc:
                self.conn.close()
                if refused == self.retries:
                    raise EndpointError(f"POST {self.prefix + path}: {exc}") from exc
                time.sleep(0.1 * 2**refused)
                refused += 1
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.conn.close()  # a kept-alive connection the server closed: once more, anew
                if not reused:
                    raise
        if r.status >= 400:
            raise EndpointError(
                f"POST {self.prefix + path}: HTTP {r.status}: {raw[:300].decode(errors='replace')}"
            )
        return json.loads(raw)

    def close(self) -> None:
        self.conn.close()


def tool_specs(api: str) -> list[dict[str, Any]]:
    """The three tools in the given API's format."""
    specs = []
    for name, (props, desc) in _PARAMS.items():
        schema = {"type": "object", "properties": props, "required": list(props)}
        if api == "chat":
            specs.append(
                {
                    "type": "function",
                    "function": {"name": name, "description": desc, "parameters": schema},
                }
            )
        else:
            specs.append({"name": name, "description": desc, "input_schema": schema})
    return specs


def run_tool(name: str, args: dict[str, Any], cwd: Path, timeout: float = 120.0) -> str:
    """Execute one tool call in ``cwd``; the result text (errors are results too, never raised)."""
    if name not in _PARAMS:
        return f"error: unknown tool {name!r}; tools: {', '.join(_PARAMS)}"
    try:
        if name == "bash":
            p = subprocess.run(
                ["bash", "-c", str(args["command"])],
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=timeout,
                errors="replace",
            )
            return f"exit code {p.returncode}\nstdout:\n{p.stdout[-_LIMIT:]}\nstderr:\n{p.stderr[-_LIMIT:]}"
        path = (cwd / str(args["path"])).resolve()
        if not path.is_relative_to(cwd.resolve()):
            return f"error: {args['path']} is outside the workspace"
        if name == "read_file":
            return path.read_text(encoding="utf-8", errors="replace")[:_LIMIT]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(str(args["content"]), encoding="utf-8")
        return f"wrote {len(str(args['content']))} characters to {args['path']}"
    except subprocess.TimeoutExpired:
        return f"error: command timed out after {timeout:.0f}s"
    except (KeyError, OSError, TypeError) as exc:
        return f"error: {type(exc).__name__}: {exc}"


def _chat_step(post: Post, model: str, messages: list, tools: list | None, max_tokens: int):
    body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens}
    if tools:
        body["tools"] = tools
    msg = post("/chat/completions", body)["choices"][0]["message"]
    calls = []
    for tc in msg.get("tool_calls") or []:
        try:
            args = json.loads(tc["function"]["arguments"] or "{}")
            assert isinstance(args, dict)
            calls.append((tc["id"], tc["function"]["name"], args))
        except (KeyError, TypeError, ValueError, AssertionError):
            return msg.get("content") or "", [], None
    reply = (
        {"role": "assistant", "content": msg.get("content"), "tool_calls": msg.get("tool_calls")}
        if calls
        else None
    )
    return msg.get("content") or "", calls, reply


def _anthropic_step(post: Post, model: str, messages: list, tools: list | None, max_tokens: int):
    body: dict[str, Any] = {
        "model": model,
        "system": SYSTEM,
        "messages": messages,
        "max_tokens": max_tokens,
    }
    if tools:
        body["tools"] = tools
    blocks = post("/v1/messages", body).get("content") or []
    text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
    calls = [
        (b["id"], b["name"], b["input"])
        for b in blocks
        if b.get("type") == "tool_use"
        and isinstance(b.get("input"), dict)
        and "id" in b
        and "name" in b
    ]
    return text, calls, ({"role": "assistant", "content": blocks} if calls else None)


def run_agent(
    instruction: str,
    *,
    api: str,
    model: str,
    base_url: str,
    api_key: str,
    cwd: Path,
    max_turns: int = 30,
    use_tools: bool = True,
    timeout: float = 600.0,
    max_tokens: int = 1024,
    post: Post | None = None,
) -> tuple[str, int, bool]:
    """Run the agent loop; returns (final answer text, turns used, whether the turn limit hit).

    ``post`` sends one request (default: an :class:`Endpoint` on ``base_url`` with the key's
    header, which retries refused connections a few times: a proxy may still be starting).
    """
    headers = (
        {"authorization": f"Bearer {api_key}"}
        if api == "chat"
        else {"x-api-key": api_key, "anthropic-version": "2023-06-01"}
    )
    tools = tool_specs(api) if use_tools else None
    if api == "chat":
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": instruction},
        ]
    else:
        messages = [{"role": "user", "content": instruction}]
    step = _chat_step if api == "chat" else _anthropic_step
    text = ""
    endpoint = None
    if post is None:
        post = endpoint = Endpoint(base_url, headers, timeout)
    try:
        for turn in range(1, max_turns + 1):
            text, calls, reply = step(post, model, messages, tools, max_tokens)
            if not calls:
                return text, turn, False
            messages.append(reply)
            results = [(cid, run_tool(name, args, cwd)) for cid, name, args in calls]
            if api == "chat":
                messages += [
                    {"role": "tool", "tool_call_id": cid, "content": out} for cid, out in results
                ]
            else:
                messages.append(
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": cid, "content": out}
                            for cid, out in results
                        ],
                    }
                )
    finally:
        if endpoint is not None:
            endpoint.close()
    return text, max_turns, True


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point (see the module docstring)."""
    ap = argparse.ArgumentParser(
        prog="python -m claw_bench.agent", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--api", choices=["chat", "anthropic"], required=True)
    ap.add_argument("--model", default="claw-policy")
    ap.add_argument("--instruction", help="the task text")
    ap.add_argument("--instruction-file", help="file holding the task text")
    ap.add_argument("--base-url", help="default: $OPENAI_BASE_URL (chat) or $ANTHROPIC_BASE_URL")
    ap.add_argument("--max-turns", type=int, default=30)
    ap.add_argument("--no-tools", action="store_true", help="send no tool definitions (plain text)")
    ap.add_argument("--answer-file", help="write the final text answer to this file")
    ap.add_argument("--max-tokens", type=int, default=1024, help="max_tokens of each model request")
    ap.add_argument(
        "--timeout", type=float, default=600.0, help="HTTP timeout per request, seconds"
    )
    a = ap.parse_args(argv)
    if (a.instruction is None) == (a.instruction_file is None):
        ap.error("give exactly one of --instruction and --instruction-file")
    instruction = (
        a.instruction
        if a.instruction is not None
        else Path(a.instruction_file).read_text(encoding="utf-8")
    )
    prefix = "OPENAI" if a.api == "chat" else "ANTHROPIC"
    base_url = a.base_url or os.environ.get(f"{prefix}_BASE_URL")
    key = os.environ.get(f"{prefix}_API_KEY", "")
    if not base_url:
        ap.error(f"no endpoint: pass --base-url or set {prefix}_BASE_URL")
    try:
        text, turns, limited = run_agent(
            instruction,
            api=a.api,
            model=a.model,
            base_url=base_url,
            api_key=key,
            cwd=Path.cwd(),
            max_turns=a.max_turns,
            use_tools=not a.no_tools,
            timeout=a.timeout,
            max_tokens=a.max_tokens,
        )
    except (
        EndpointError,
        http.client.HTTPException,
        OSError,
        ValueError,
        LookupError,
        TypeError,
    ) as exc:
        print(f"claw-agent: endpoint failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if a.answer_file:
        Path(a.answer_file).write_text(text, encoding="utf-8")
    if limited:
        print(
            f"claw-agent: stopped at the turn limit ({turns} turns) without a final answer",
            file=sys.stderr,
        )
    else:
        print(f"claw-agent: finished after {turns} turn(s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
