"""The GPU checks' CPU dry runs: what the GPU runs will write, and what launch.sh would start.

bench/gpu_check.py --tiny (tree training with a tiny model), bench/gpu_check.sh --loop --tiny
(2 real loop steps) and DRY_RUN=1 examples/gpu/launch.sh (checks and commands, nothing started).

Run: .venvs/workspace/bin/python -m pytest bench/test_gpu_check.py -s
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_check  # noqa: E402


def test_gpu_check_tiny_dry_run(tmp_path):
    """The tiny run measures tree, chain merge and per call at two sizes and writes one JSON
    file with their tokens, times and the tree's token ratios and speedups."""
    out = tmp_path / "gpu_check.json"
    gpu_check.main(["--tiny", "--out", str(out), "--sizes", "2048", "4096", "--cap", "8000"])
    report = json.loads(out.read_text())
    assert set(report["sizes"]) == {"2048", "4096"}
    for n, row in report["sizes"].items():
        assert row["tree"]["tokens"] == int(n)
        for other in ("chain_merge", "per_call"):
            assert row[other]["tokens"] >= row["tree"]["tokens"] * 0.9  # paths repeat prefixes
            assert row[f"{other}_token_ratio"] == row[other]["tokens"] / int(n)
            assert row[other]["seconds"] > 0 and row[f"{other}_speedup"] > 0
    assert report["sizes"]["4096"]["per_call"]["subset"]  # 10K per-call tokens > --cap 8000


# --- issue 28: the real-loop smoke (bench/gpu_check.sh --loop) and examples/gpu/launch.sh -------

ROOT = Path(__file__).resolve().parent.parent
CLAWGYM = ROOT / "packages/claw-bench/tests/fixtures/public/clawgym"
GPU_LIKE_PY = ROOT / ".venvs/vllm/bin/python"  # torch + transformers, no claw package installed
ALL_FIVE = ("claw_bench", "claw_proxy", "claw_sandbox", "claw_tree", "claw_rl")
workspace = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ALL_FIVE),
    reason="needs the five claw packages (.venvs/workspace)",
)


def _loop_smoke(tmp_path: Path, python: str) -> dict:
    out = tmp_path / "gpu_loop_check.json"
    env = {**os.environ, "PYTHON": python, "CLAW_GPU_DEPS": str(tmp_path / "none")}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        ["bash", "bench/gpu_check.sh", "--loop", "--tiny", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def _assert_smoke_report(report: dict) -> None:
    assert report["done"] and report["ok"], report
    assert report["vllm"] == "not used (--tiny)" and report["engine"] == "transformers"
    assert report["harness"] == "claw-agent-text" and report["harness_reason"]
    assert [s["step"] for s in report["steps"]] == [0, 1]
    for s in report["steps"]:
        assert s["rollouts"] == 4 and s["rollouts_failed"] == 0
        assert s["completion_tokens"] > 0  # the harness reached the policy through the proxy
        assert s["rollout_s"] > 0 and s["train_s"] >= 0 and s["reload_s"] >= 0
        assert set(s["pass@1"]) == {"claw-agent-text"} and 0 <= s["pass@1"]["claw-agent-text"] <= 1
    assert [s["policy_version"] for s in report["steps"]] == [1, 2]  # each step reloaded weights
    assert report["initial_reload_s"] >= 0 and report["wall_s"] > 0


@workspace
def test_gpu_loop_smoke_tiny_dry_run(tmp_path):
    """`gpu_check.sh --loop --tiny`: 2 real loop steps on CPU (transformers engine,
    claw-agent-text in the process backend) write one JSON with per-step rollout, train and
    reload seconds and Pass@1, and say which engine and harness ran and why."""
    _assert_smoke_report(_loop_smoke(tmp_path, sys.executable))


@pytest.mark.skipif(not GPU_LIKE_PY.exists(), reason="no .venvs/vllm (a Python without claw)")
def test_gpu_loop_smoke_without_installed_claw(tmp_path):
    """As on the GPU machine: a Python with torch and transformers but no claw package
    installed runs the smoke from the checkout (PYTHONPATH, package metadata, and the harness's
    sandboxed agent also finds the packages)."""
    check = [str(GPU_LIKE_PY), "-c", "import importlib.util as u; print(u.find_spec('claw_rl'))"]
    assert subprocess.run(check, capture_output=True, text=True).stdout.strip() == "None"
    _assert_smoke_report(_loop_smoke(tmp_path, str(GPU_LIKE_PY)))


def _launch(tmp_path: Path, tools: Path, suite: Path, *args: str) -> subprocess.CompletedProcess:
    model = tmp_path / "Qwen3-4B"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text('{"model_type": "qwen3"}')
    (model / "tokenizer.json").write_text("{}")
    env = {
        "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DRY_RUN": "1", "MODEL": str(model),
        "SUITE": str(suite), "HARNESSES": "claude-code openclaw-chat", "CLAW_TOOLS": str(tools),
        "CLAW_PY": sys.executable, "VLLM_PY": str(tmp_path / "no-vllm-python"),
        "RUN_DIR": str(tmp_path / "run"),
    }  # fmt: skip
    cmd = ["bash", "examples/gpu/launch.sh", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@workspace
def test_launch_dry_run(tmp_path):
    """DRY_RUN=1 launch.sh checks the model dir, the ClawGym suite and the harness binaries,
    reports the GPU checks that fail here without failing, and prints the exact vLLM command
    (claw worker extension) and the loop through Claude Code + OpenClaw; it starts nothing.
    Without the binaries it fails, naming ./dev/install-harnesses; a missing suite fails too."""
    tools = tmp_path / "tools"
    (tools / "bin").mkdir(parents=True)
    for binary in ("claude", "openclaw"):
        (tools / "bin" / binary).write_text("#!/bin/sh\nexit 0\n")
        (tools / "bin" / binary).chmod(0o755)
    done = _launch(tmp_path, tools, CLAWGYM, "--steps", "2")
    assert done.returncode == 0, done.stderr
    assert "suite" in done.stderr and "4 tasks" in done.stderr
    assert "would fail here" in done.stderr and "cannot import vllm" in done.stderr
    vllm, loop = [line for line in done.stdout.splitlines() if not line.startswith("#")]
    assert "--worker-extension-cls claw_vllm_worker.ClawWorkerExtension" in vllm
    assert "VLLM_SERVER_DEV_MODE=1" in vllm and "--enable-prefix-caching" in vllm
    for part in ("--harness claude-code --harness openclaw-chat", f"--suite {CLAWGYM}",
                 "--engine vllm:http://127.0.0.1:8001", "--pack batch", "--steps 2"):  # fmt: skip
        assert part in loop, (part, loop)
    assert not (tmp_path / "run").exists()

    empty = tmp_path / "no-tools"
    done = _launch(tmp_path, empty, tmp_path / "no-such-suite")
    assert done.returncode == 1 and not done.stdout
    assert "claude not on PATH" in done.stderr and "openclaw not on PATH" in done.stderr
    assert "./dev/install-harnesses" in done.stderr and "no-such-suite" in done.stderr
