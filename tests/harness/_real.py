"""Rollouts of toy tasks through the real Claude Code and OpenClaw, with the public library calls.

claw-bench plans the jobs (`claw_bench.rollouts`), `claw-sandbox run` runs them in bwrap (the
harnesses live in the checkout's .tools, shown read-only), and an in-process claw-proxy
(`claw_proxy.ProxyServer`) serves them: the scripted engine (the teacher) or the in-process
transformers engine (the policy). Used by test_real_teacher.py and test_real_rl.py.
"""

from __future__ import annotations

import os
import shutil
import statistics
from pathlib import Path

import claw_bench
import claw_proxy
import claw_tree
from _pipeline import TOOLS_BIN
from _servers import BIN, ROOT

#: the real harnesses of issue 28 and the binary each needs
REAL = {"claude-code": "claude", "openclaw-chat": "openclaw"}
SECRET = "real-harness-secret"
ADMIN = "real-harness-admin"
JOB_TIMEOUT_S = 900


def missing(harness: str) -> str | None:
    """Why `harness` cannot run here (its binary, bwrap or a claw CLI is missing), or None."""
    binary = REAL[harness]
    if not (TOOLS_BIN / binary).exists():
        return f"harness {binary!r} is not installed in {TOOLS_BIN}: run ./dev/install-harnesses"
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed: the real harnesses run in its sandbox"
    if not (BIN / "claw-sandbox").exists():
        return f"claw-sandbox is not installed next to {BIN / 'python'}"
    return None


def sandbox_env(monkeypatch) -> None:
    """The harnesses (.tools/bin) and the claw CLIs on PATH, the checkout visible in bwrap."""
    path = os.pathsep.join([str(TOOLS_BIN), str(BIN), os.environ.get("PATH", "")])
    monkeypatch.setenv("PATH", path)
    ro = os.environ.get("CLAW_SANDBOX_RO_PATHS")
    monkeypatch.setenv("CLAW_SANDBOX_RO_PATHS", os.pathsep.join(p for p in (ro, str(ROOT)) if p))
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))


def proxy(engine: str, record: Path, tokenizer: str | None, max_tokens: int, seed: int = 0):
    """An in-process claw-proxy over `engine` on a free port, recording every call to `record`."""
    cfg = claw_proxy.ProxyConfig(
        engine=engine, tokenizer=tokenizer, secret=SECRET, admin_token=ADMIN, record=str(record),
        policy_name="policy", max_tokens_cap=max_tokens, default_max_tokens=max_tokens, seed=seed,
    )  # fmt: skip
    return claw_proxy.ProxyServer(cfg)


def play(tasks, harnesses: list, url: str, runs: Path, run_id: str, samples: int = 1,
         group_by: str = "task+harness"):  # fmt: skip
    """`samples` rollouts of every (task, harness) against the proxy at `url`, run by
    `claw-sandbox run` in bwrap, 2 at a time; returns claw_bench's Rollouts. A harness is a
    name or a loaded claw_bench.Harness. GRPO groups: by default each harness's rollouts of a
    task, whose sessions share the harness's prompt."""
    cli = claw_bench.sandbox_cli(
        backend="bwrap", parallel=2, output=runs, args=["--ro-path", str(ROOT), "--retries", "0"]
    )

    def runner(jobs: list[dict]) -> list[dict]:
        for job in jobs:  # a 25K-token prefill takes seconds on a loaded CPU: no task deadline
            job["timeout_s"] = JOB_TIMEOUT_S
        return cli(jobs)

    return claw_bench.rollouts(
        list(tasks),
        [h if isinstance(h, claw_bench.Harness) else claw_bench.load_harness(h) for h in harnesses],
        runner,
        samples=samples,
        proxy_url=url,
        secret=SECRET.encode(),
        run_id=run_id,
        group_by=group_by,
    )


def per_harness(calls: list[dict], outcomes: list[dict]) -> dict[str, dict]:
    """For each harness: its calls, mean prompt tokens per call, and its forest's statistics."""
    harness_of = {o["session"]: o["harness"] for o in outcomes}
    out: dict[str, dict] = {}
    for h in sorted(set(harness_of.values())):
        mine = [c for c in calls if harness_of.get(c["session"]) == h]
        forest = claw_tree.build_forest([claw_tree.Call.from_dict(c) for c in mine])
        stats = claw_tree.forest_stats(forest) if mine else {}
        out[h] = {
            "calls": mine,
            "prompt_tokens_per_call": statistics.fmean(len(c["prompt_ids"]) for c in mine)
            if mine
            else 0.0,
            "dedup_factor": stats.get("dedup_factor"),  # flat tokens / tree tokens
            "forest": forest,
        }
    return out
