"""One harness conformance run: scripted claw-proxy + tap, claw-bench plan, claw-sandbox run.

The pieces meet only through their CLIs and JSONL files, as in production:

    claw-proxy serve --engine scripted:script.jsonl ...     (the policy: chosen token sequences)
    claw-bench plan --suite claw-mini --task csv-filter-region --harness H --proxy TAP ...
    claw-sandbox run jobs.jsonl -o runs.jsonl --backend auto  (network policy `proxy`)
    claw-tree stats --json calls.jsonl

and the result is checked against what the tap saw, what the sandbox reported and what the
proxy recorded.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from _servers import BIN, ROOT, Tap, claw_proxy

TOOLS_BIN = Path(os.environ.get("CLAW_TOOLS", ROOT / ".tools")) / "bin"
SUITE, TASK = "claw-mini", "csv-filter-region"
# The shell command every scripted harness runs: it solves csv-filter-region.
SOLVE = "{ head -n 1 sales.csv; awk -F, '$2 == \"EU\"' sales.csv; } > eu_sales.csv"
OUTPUT_FILE = "eu_sales.csv"
EXPECTED_OUTPUT = "date,region,product,amount\n2024-01-02,EU,widget,120\n2024-01-03,EU,gadget,45\n2024-01-06,EU,gizmo,99\n"
MAIN_MODEL, SUB_MODEL = "claw-policy", "claw-small"


def tool_call(name: str, arguments: dict) -> str:
    """The Qwen3 / Hermes text of one tool call, as the tiny model's chat template writes it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


@dataclass(frozen=True)
class Case:
    """A harness adapter (claw-bench TOML) with the answers the scripted policy gives it."""

    name: str
    adapter: str
    binary: str
    api: str
    answers: tuple[dict, ...]
    env: dict = field(default_factory=dict)
    subagents: bool = False
    label: str = ""
    edits_history: str = ""  # why this harness may rewrite earlier messages (a context branch)


def _two_turns(tool: str, args: dict) -> tuple[dict, ...]:
    return ({"text": tool_call(tool, args)}, {"text": f"Done: {OUTPUT_FILE} holds the EU rows."})


OPENCLAW_EDIT = (
    "its internal-context user message follows the latest turn, then moves in the next request"
)

CASES = [
    Case(
        name="claude-code",
        adapter="claude-code",
        binary="claude",
        api="Anthropic Messages",
        answers=_two_turns("Bash", {"command": SOLVE, "description": "Write the EU rows"}),
        label="Claude Code",
    ),
    Case(
        name="claude-code-subagent",
        adapter="claude-code",
        binary="claude",
        api="Anthropic Messages",
        label="Claude Code, sub-agent",
        subagents=True,
        env={"ANTHROPIC_DEFAULT_HAIKU_MODEL": SUB_MODEL},
        answers=(
            {
                "model": MAIN_MODEL,
                "text": tool_call(
                    "Agent",
                    {
                        "description": "Filter EU rows",
                        "subagent_type": "general-purpose",
                        "model": "haiku",
                        "run_in_background": False,
                        "prompt": f"From sales.csv write {OUTPUT_FILE} with the header and the EU rows.",
                    },
                ),
            },
            {"model": MAIN_MODEL, "text": f"The sub-agent wrote {OUTPUT_FILE}."},
            {
                "model": SUB_MODEL,
                "text": tool_call("Bash", {"command": SOLVE, "description": "Write the EU rows"}),
            },
            {"model": SUB_MODEL, "text": f"Wrote {OUTPUT_FILE}."},
        ),
    ),
    Case(
        name="openclaw-chat",
        adapter="openclaw-chat",
        binary="openclaw",
        api="OpenAI chat",
        answers=_two_turns("exec", {"command": SOLVE}),
        label="OpenClaw (openai-completions)",
        edits_history=OPENCLAW_EDIT,
    ),
    Case(
        name="openclaw-anthropic",
        adapter="openclaw-anthropic",
        binary="openclaw",
        api="Anthropic Messages",
        answers=_two_turns("exec", {"command": SOLVE}),
        label="OpenClaw (anthropic-messages)",
        edits_history=OPENCLAW_EDIT,
    ),
    Case(
        name="openclaw-responses",
        adapter="openclaw-responses",
        binary="openclaw",
        api="OpenAI Responses",
        answers=_two_turns("exec", {"command": SOLVE}),
        label="OpenClaw (openai-responses)",
        edits_history=OPENCLAW_EDIT,
    ),
    Case(
        name="codex",
        adapter="codex",
        binary="codex",
        api="OpenAI Responses",
        answers=_two_turns("exec_command", {"cmd": SOLVE}),
        label="Codex CLI",
    ),
    Case(
        name="mini-swe-agent",
        adapter="mini-swe-agent",
        binary="mini",
        api="OpenAI chat",
        answers=(
            {"text": tool_call("bash", {"command": SOLVE})},
            {"text": tool_call("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})},
        ),
        label="mini-swe-agent",
    ),
]


def missing_pieces(case: Case) -> str | None:
    """Why this case cannot run here (a harness or a claw CLI is missing), or None."""
    for cli in ("claw-proxy", "claw-bench", "claw-sandbox", "claw-tree"):
        if not (BIN / cli).exists():
            return f"{cli} is not installed next to {BIN / 'python'}"
    if not (TOOLS_BIN / case.binary).exists():
        return (
            f"harness {case.binary!r} is not installed in {TOOLS_BIN}: run ./dev/install-harnesses"
        )
    return None


def installed_version(case: Case) -> str:
    """The installed harness version as dev/install-harnesses recorded it."""
    key = {"claude": "claude", "openclaw": "openclaw", "codex": "codex", "mini": "mini"}[
        case.binary
    ]
    try:
        return json.loads((TOOLS_BIN.parent / "harnesses.json").read_text())[key]["version"] or "?"
    except (OSError, ValueError, KeyError):
        return "?"


def _cli(
    args: list[str], env: dict | None = None, timeout: float = 900
) -> subprocess.CompletedProcess:
    r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(args[:3])} ... exited {r.returncode}\n{r.stderr[-3000:]}")
    return r


@dataclass
class Outcome:
    """Everything a conformance run produced."""

    case: Case
    run: dict
    calls: list[dict]
    requests: list[dict]
    stats: dict
    seconds: float
    workdir: Path


def run_case(
    case: Case,
    workdir: Path,
    backend: str = "auto",
    timeout_s: float = 300,
    engine: str | None = None,
    proxy_extra: tuple[str, ...] = ("--policy-name", "scripted"),
) -> Outcome:
    """Run one harness on csv-filter-region through claw-proxy inside claw-sandbox.

    The engine is the scripted one with the case's answers unless `engine` names another.
    """
    if engine is None:
        script = workdir / "script.jsonl"
        script.write_text("".join(json.dumps(a) + "\n" for a in case.answers))
        engine = f"scripted:{script}"
    t0 = time.monotonic()
    with (
        claw_proxy(engine, workdir, extra=proxy_extra) as (url, secret, calls_file),
        Tap(url) as tap,
    ):
        jobs_file = workdir / "jobs.jsonl"
        _cli(
            [
                str(BIN / "claw-bench"),
                "plan",
                "--suite",
                SUITE,
                "--task",
                TASK,
                "--harness",
                case.adapter,
                "--proxy",
                tap.url,
                "--proxy-secret-file",
                str(secret),
                "--run-id",
                "h8",  # short: the sandbox puts a unix socket under the job id
                "--model",
                MAIN_MODEL,
                "-o",
                str(jobs_file),
            ]
        )
        jobs = [json.loads(line) for line in jobs_file.read_text().splitlines() if line.strip()]
        assert len(jobs) == 1, jobs
        for job in jobs:
            job["env"].update(case.env)
            job["collect"] = [*job.get("collect", []), OUTPUT_FILE]
            job["timeout_s"] = timeout_s
        jobs_file.write_text("".join(json.dumps(j) + "\n" for j in jobs))
        env = dict(
            os.environ, PATH=f"{TOOLS_BIN}{os.pathsep}{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
        )
        runs_file = workdir / "runs.jsonl"
        _cli(
            [
                str(BIN / "claw-sandbox"),
                "run",
                str(jobs_file),
                "-o",
                str(runs_file),
                "--backend",
                backend,
                "--parallel",
                "1",
                "--retries",
                "0",
                # the harnesses live in the checkout (.tools, .venvs): keep it visible wherever it is
                # cloned, also under /tmp or a home directory, which bwrap hides
                "--ro-path",
                str(ROOT),
            ],
            env=env,
            timeout=timeout_s + 120,
        )
        requests = list(tap.requests)
    seconds = time.monotonic() - t0
    runs = [json.loads(line) for line in runs_file.read_text().splitlines() if line.strip()]
    calls = (
        [json.loads(line) for line in calls_file.read_text().splitlines() if line.strip()]
        if calls_file.exists()
        else []
    )
    stats = (
        json.loads(_cli([str(BIN / "claw-tree"), "stats", "--json", str(calls_file)]).stdout)
        if calls
        else {}
    )
    return Outcome(
        case=case,
        run=runs[0],
        calls=calls,
        requests=requests,
        stats=stats,
        seconds=seconds,
        workdir=workdir,
    )


def prefix_pairs(calls: list[dict]) -> list[dict]:
    """How each call's prompt relates to the previous call of the same conversation.

    Within a session, the calls that ask for the same model name form one conversation (the
    main agent, or a sub-agent under another name). For consecutive calls prev, cur let n be
    the longest common prefix of prev.prompt_ids + prev.completion_ids and cur.prompt_ids:

    - ``extends``: n covers all of prev's tokens and the proxy says it reused them
      (prefix.parent_call is prev); the proxy issue's multi-turn prefix property;
    - ``not_reused``: cur extends prev but the proxy did not record the reuse;
    - ``edited``: n < len(prev.prompt_ids): the harness changed history (a context branch);
    - ``false_fork``: n falls inside prev's completion: the model's own sampled tokens came
      back as different ids (what re-tokenizing text does; prefix reuse must prevent it).
    """
    out = []
    chains: dict[tuple[str, str], list[dict]] = {}
    for c in sorted(calls, key=lambda c: (c["session"], c["seq"])):
        chains.setdefault((c["session"], c["model"]), []).append(c)
    for (session, model), chain in chains.items():
        for prev, cur in zip(chain, chain[1:], strict=False):
            before, now = prev["prompt_ids"] + prev["completion_ids"], cur["prompt_ids"]
            n = next(
                (i for i, (a, b) in enumerate(zip(before, now, strict=False)) if a != b),
                min(len(before), len(now)),
            )
            if n == len(before):
                kind = (
                    "extends"
                    if (cur.get("prefix") or {}).get("parent_call") == prev["call_id"]
                    else "not_reused"
                )
            elif n < len(prev["prompt_ids"]):
                kind = "edited"
            else:
                kind = "false_fork"
            out.append(
                {
                    "session": session,
                    "model": model,
                    "seq": cur["seq"],
                    "prev_seq": prev["seq"],
                    "kind": kind,
                    "common": n,
                    "prev_prompt": len(prev["prompt_ids"]),
                    "prev_total": len(before),
                }
            )
    return out
