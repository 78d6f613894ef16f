"""Real harnesses through claw-proxy inside claw-sandbox, driven by the scripted engine.

Each case installs nothing: it uses what ./dev/install-harnesses put in .tools/ and is
skipped, with the reason, when the harness or a claw CLI is missing. A case runs the harness
headless on the claw-mini task csv-filter-region (bwrap where it works, else the process
backend; network policy `proxy`) against `claw-proxy serve --engine scripted:...`, then checks
exit code, workspace, records and token prefixes, and writes its row of HARNESSES.md.
"""

from __future__ import annotations

import pytest
from _pipeline import (
    CASES,
    EXPECTED_OUTPUT,
    OUTPUT_FILE,
    SUB_MODEL,
    Case,
    installed_version,
    missing_pieces,
    prefix_pairs,
    run_case,
)
from _results import COMMITTED, TABLE, load, record, render


def _entry(case: Case, o) -> dict:
    api_requests = [r for r in o.requests if r["method"] == "POST" and r["path"].startswith("/v1/")]
    pairs = prefix_pairs(o.calls)
    stats = o.stats
    kinds = [p["kind"] for p in pairs]
    run = o.run
    verify = run.get("verify") or {}
    return {
        "label": case.label or case.name,
        "version": installed_version(case),
        "api": case.api,
        "adapter": case.adapter,
        "backend": run.get("backend"),
        "seconds": round(o.seconds, 1),
        "streaming": bool(api_requests)
        and all(r.get("content_type", "").startswith("text/event-stream") for r in api_requests),
        "requests": len(api_requests),
        "calls": len(o.calls),
        "tool_calls": sum(1 for c in o.calls if c["finish_reason"] == "tool_calls"),
        "subagent_branches": (stats.get("trajectories", 0) - 1) if case.subagents else None,
        "passed": None,  # filled in after the checks
        "exit_code": run.get("exit_code"),
        "verify_passed": verify.get("passed"),
        "drift": {
            "extends": kinds.count("extends"),
            "edited": kinds.count("edited"),
            "not_reused": kinds.count("not_reused"),
            "false_fork_pairs": kinds.count("false_fork"),
            "rerender_differs": stats.get("false_forks_avoided", 0),
            "output_branches": (stats.get("branch_reasons") or {}).get("output", 0),
            "note": case.edits_history if kinds.count("edited") else "",
        },
    }


def _problems(case: Case, o, entry: dict) -> list[str]:
    """Every way this run falls short of the conformance contract (empty = passes)."""
    p = []
    run = o.run
    if run.get("status") != "ok" or run.get("exit_code") != 0:
        p.append(
            f"harness run: status {run.get('status')}, exit code {run.get('exit_code')}, "
            f"error {run.get('error')!r}\nstderr tail:\n{run.get('stderr_tail', '')[-2000:]}"
        )
    if not (run.get("verify") or {}).get("passed"):
        p.append(f"verifier did not pass: {(run.get('verify') or {}).get('output', '')!r}")
    if (run.get("collected") or {}).get(OUTPUT_FILE) != EXPECTED_OUTPUT:
        p.append(
            f"{OUTPUT_FILE} in the workspace: {(run.get('collected') or {}).get(OUTPUT_FILE)!r}"
        )
    api_requests = [r for r in o.requests if r["method"] == "POST" and r["path"].startswith("/v1/")]
    bad = [r for r in api_requests if r["status"] != 200]
    if bad:
        p.append(f"requests answered with an error: {bad}")
    if len(o.calls) != len(api_requests) or not o.calls:
        p.append(f"{len(api_requests)} API requests but {len(o.calls)} claw.call/v1 records")
    sessions = {c["session"] for c in o.calls}
    if sessions != {run.get("meta", {}).get("session")}:
        p.append(
            f"records name sessions {sessions}, the job's session is {run.get('meta', {}).get('session')!r}"
        )
    if entry["tool_calls"] < 1:
        p.append("no recorded call ended in a tool call")
    for pair in prefix_pairs(o.calls):
        if pair["kind"] in ("false_fork", "not_reused") or (
            pair["kind"] == "edited" and not case.edits_history
        ):
            p.append(f"prefix property: {pair}")
    if entry["drift"]["output_branches"]:
        p.append(
            f"claw-tree stats: {entry['drift']['output_branches']} output branches (false forks)"
        )
    if case.subagents:
        models = {c["model"] for c in o.calls}
        if SUB_MODEL not in models:
            p.append(
                f"no call asked for the sub-agent model {SUB_MODEL!r}; models seen: {sorted(models)}"
            )
        if (entry["subagent_branches"] or 0) < 1:
            p.append(f"the sub-agent made no branch of its own: claw-tree stats {o.stats}")
    return p


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_harness_through_proxy_in_sandbox(case: Case, tmp_path):
    """The harness finishes with exit 0, runs the scripted tool call, and leaves exact records."""
    why = missing_pieces(case)
    if why:
        record(case.name, {"label": case.label or case.name, "api": case.api, "skipped": why})
        pytest.skip(why)
    outcome = run_case(case, tmp_path)
    entry = _entry(case, outcome)
    problems = _problems(case, outcome, entry)
    entry["passed"] = not problems
    entry["problems"] = problems
    record(case.name, entry)
    assert not problems, f"{case.name}:\n" + "\n".join(problems)


def test_harness_table_is_rendered_from_the_results():
    """HARNESSES.md is exactly what render_table.py makes of tests/harness/results.json."""
    data = load(COMMITTED)
    assert data["cases"], "tests/harness/results.json holds no case"
    assert TABLE.read_text() == render(data), "run: python tests/harness/render_table.py"


def test_prefix_pairs_classifies_extension_edit_and_false_fork():
    """The prefix check tells a clean extension, a history edit and a false fork apart."""

    def call(seq, prompt, completion, parent=None):
        return {
            "session": "s",
            "model": "m",
            "seq": seq,
            "call_id": f"c{seq}",
            "prompt_ids": prompt,
            "completion_ids": completion,
            "prefix": {"parent_call": parent},
        }

    base = call(0, [1, 2, 3], [4, 5])
    assert [p["kind"] for p in prefix_pairs([base, call(1, [1, 2, 3, 4, 5, 6], [7], "c0")])] == [
        "extends"
    ]
    assert [p["kind"] for p in prefix_pairs([base, call(1, [1, 2, 3, 4, 5, 6], [7])])] == [
        "not_reused"
    ]
    assert [p["kind"] for p in prefix_pairs([base, call(1, [1, 9, 3, 4, 5], [7])])] == ["edited"]
    fork = prefix_pairs([base, call(1, [1, 2, 3, 4, 8, 6], [7])])
    assert [(p["kind"], p["common"]) for p in fork] == [("false_fork", 4)]
    other_model = {**call(1, [9], [9]), "model": "sub"}
    assert prefix_pairs([base, other_model]) == []
