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
        assert s["rollout_s"] > 0 and s["train_s"] >= 0
        # a step without learning signal publishes no version, so the engine reloads nothing
        assert (s["reload_s"] is None) if s["no_signal"] else s["reload_s"] >= 0
        assert set(s["pass@1"]) == {"claw-agent-text"} and 0 <= s["pass@1"]["claw-agent-text"] <= 1
    versions = [s["policy_version"] for s in report["steps"]]
    learnt = [not s["no_signal"] for s in report["steps"]]
    assert versions == [sum(learnt[: i + 1]) for i in range(len(learnt))]
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


def _launch(
    tmp_path: Path, tools: Path, suite: Path, *args: str, model: str = "Qwen3-4B",
    config: dict | None = None, **env_extra: str,
) -> subprocess.CompletedProcess:  # fmt: skip
    """DRY_RUN=1 launch.sh on a model dir holding `config` (a bare dense Qwen3 by default)."""
    model_dir = tmp_path / model
    model_dir.mkdir(exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(config or {"model_type": "qwen3"}))
    (model_dir / "tokenizer.json").write_text("{}")
    env = {
        "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DRY_RUN": "1", "MODEL": str(model_dir),
        "SUITE": str(suite), "HARNESSES": "claude-code openclaw-chat", "CLAW_TOOLS": str(tools),
        "CLAW_PY": sys.executable, "VLLM_PY": str(tmp_path / "no-vllm-python"),
        "RUN_DIR": str(tmp_path / "run"), **env_extra,
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


# --- issue 40: an MoE checkpoint (routed experts from vLLM, routing replay in the learner) -------

sys.path.insert(0, str(ROOT / "examples/gpu"))
import preflight  # noqa: E402

#: Qwen3-30B-A3B's config.json (its shape fields)
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 151936,
    "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "norm_topk_prob": True, "tie_word_embeddings": False, "max_position_embeddings": 40960,
}  # fmt: skip


def _tools(tmp_path: Path) -> Path:
    tools = tmp_path / "tools"
    (tools / "bin").mkdir(parents=True, exist_ok=True)
    for binary in ("claude", "openclaw"):
        (tools / "bin" / binary).write_text("#!/bin/sh\nexit 0\n")
        (tools / "bin" / binary).chmod(0o755)
    return tools


def _fake_vllm(tmp_path: Path, version: str) -> str:
    """A VLLM_PY that answers launch.sh's version probe with `version` (nothing else runs it)."""
    path = tmp_path / f"vllm-{version}"
    path.write_text(f"#!/bin/sh\necho {version}\n")
    path.chmod(0o755)
    return str(path)


@workspace
def test_launch_dry_run_dense_commands_unchanged(tmp_path):
    """A dense checkpoint's commands are byte-identical to those before MoE support: no routed
    experts, no expert parallel, no routing replay, whatever VLLM_GPUS and the vLLM version."""
    tools = _tools(tmp_path)
    done = _launch(tmp_path, tools, CLAWGYM, "--steps", "2", VLLM_GPUS="0,1",
                   VLLM_PY=_fake_vllm(tmp_path, "0.22.0"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    model, vllm = tmp_path / "Qwen3-4B", tmp_path / "vllm-0.22.0"
    assert done.stdout == (
        f"# vLLM (log: {tmp_path}/run/vllm.log)\n"
        f"env CUDA_VISIBLE_DEVICES=0\\,1 VLLM_SERVER_DEV_MODE=1 PYTHONPATH={ROOT}/examples/gpu "
        f"{vllm} -m vllm.entrypoints.openai.api_server --worker-extension-cls "
        "claw_vllm_worker.ClawWorkerExtension --enable-prefix-caching --logprobs-mode "
        f"processed_logprobs --model {model} --port 8001 --host 127.0.0.1 "
        "--gpu-memory-utilization 0.45 --max-model-len 32768 \n"
        "# the RL loop, once vLLM answers on /health\n"
        f"env CUDA_VISIBLE_DEVICES=0 {sys.executable} examples/mix_harness_rl.py --run-dir "
        f"{tmp_path}/run --model {model} --engine vllm:http://127.0.0.1:8001 --tokenizer {model} "
        "--backend bwrap --parallel 32 --max-new-tokens 4096 --lr 1e-6 --epochs 1 "
        f"--minibatches 4 --pack batch --suite {CLAWGYM} --harness claude-code "
        "--harness openclaw-chat --steps 2 \n"
    )
    assert "MoE" not in done.stderr


@workspace
def test_launch_dry_run_moe_qwen3_30b_a3b(tmp_path):
    """Qwen3-30B-A3B's shape: preflight prints its MoE facts (128 experts, top-8, 48 MoE
    layers, 384 routing bytes per token, 9.6 MB per 25K-token call, 30.53B parameters of which
    3.35B active); vLLM starts with --enable-return-routed-experts (and expert parallel over
    4 GPUs), the loop with --routing-replay r3 before the user's arguments; vLLM 0.21 is
    refused with the version it needs."""
    tools = _tools(tmp_path)
    vllm = _fake_vllm(tmp_path, "0.22.0")
    kw = dict(model="Qwen3-30B-A3B", config=QWEN3_30B_A3B, VLLM_PY=vllm)
    done = _launch(tmp_path, tools, CLAWGYM, "--steps", "2", "--routing-replay", "r2", **kw)
    assert done.returncode == 0, done.stderr
    print(done.stderr)
    for fact in ("128 experts, top-8, 48 MoE layers of 48", "uint8, 384 bytes per token",
                 "9.6 MB per call of 25,000 tokens", "30.53B total, 3.35B active",
                 "vLLM 0.22.0: returns routed experts"):  # fmt: skip
        assert fact in done.stderr, fact
    vllm_cmd, loop = [line for line in done.stdout.splitlines() if not line.startswith("#")]
    assert vllm_cmd.endswith("--max-model-len 32768 --enable-return-routed-experts ")
    assert "--pack batch --routing-replay r3 --suite" in loop
    assert loop.endswith("--steps 2 --routing-replay r2 ")  # the user's own wins (argparse: last)

    done = _launch(tmp_path, tools, CLAWGYM, VLLM_GPUS="0,1,2,3", **kw)
    vllm_cmd = done.stdout.splitlines()[1]
    assert done.returncode == 0 and "CUDA_VISIBLE_DEVICES=0\\,1\\,2\\,3 " in vllm_cmd
    assert vllm_cmd.endswith(
        "--enable-return-routed-experts --tensor-parallel-size 4 --enable-expert-parallel "
    )
    done = _launch(tmp_path, tools, CLAWGYM, VLLM_GPUS="0,1,2,3", VLLM_TP="2", **kw)
    assert "--tensor-parallel-size 2 --enable-expert-parallel" in done.stdout

    kw["VLLM_PY"] = _fake_vllm(tmp_path, "0.21.0")
    done = _launch(tmp_path, tools, CLAWGYM, **kw)
    assert done.returncode == 1 and not done.stdout
    assert "vLLM 0.21.0 cannot return routed experts" in done.stderr
    assert "needs vLLM >= 0.22.0" in done.stderr


def test_preflight_moe_facts_against_transformers(tmp_path):
    """Parameter counts equal transformers' own (a Qwen3-MoE with a dense layer by
    mlp_only_layers and one by decoder_sparse_step; a tied dense Qwen3); the MoE layers,
    top-k and routing dtype follow the config (int16 past 255 experts); the tiny MoE fixture
    (transformers 5 writes num_local_experts) is detected; a *Moe* architecture without an
    expert count, and a bad top-k, fail naming the file and field."""
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    shape = dict(vocab_size=1000, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16)  # fmt: skip
    moe = Qwen3MoeForCausalLM(Qwen3MoeConfig(
        **shape, moe_intermediate_size=32, num_experts=6, num_experts_per_tok=2,
        decoder_sparse_step=2, mlp_only_layers=[3], tie_word_embeddings=False,
    ))  # fmt: skip
    dense = Qwen3ForCausalLM(Qwen3Config(**shape, tie_word_embeddings=True))
    for model in (moe, dense):
        total = sum(p.numel() for p in model.parameters())
        assert preflight.parameters(model.config.to_dict())["total"] == total
    facts = preflight.moe_shape(moe.config.to_dict())
    assert facts["moe_layers"] == 1 and facts["top_k"] == 2 and facts["dtype"] == "uint8"
    assert (
        facts["routing_bytes_per_token"] == 2
        and preflight.moe_shape(dense.config.to_dict()) is None
    )
    big = preflight.moe_shape({**QWEN3_30B_A3B, "num_experts": 256})
    assert big["dtype"] == "int16" and big["routing_bytes_per_token"] == 48 * 8 * 2

    fixture = ROOT / "tests/fixtures/tiny-qwen3-moe"
    if (fixture / "config.json").exists():
        kind, lines, problems = preflight.model_facts(fixture, "0.22.0")
        assert kind == "moe" and not problems and any("top-2" in x for x in lines)

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3MoeForCausalLM"]}))
    with pytest.raises(preflight.ModelError, match=r"config.json: architectures .*num_experts"):
        preflight.model_facts(tmp_path, "0.22.0")
    with pytest.raises(preflight.ModelError, match="field num_experts_per_tok: 9 is not in"):
        preflight.moe_shape({**QWEN3_30B_A3B, "num_experts": 8, "num_experts_per_tok": 9})
    assert preflight.vllm_version("0.22.1rc1.dev3+gabc") == (0, 22, 1)
    assert preflight.vllm_version("0.9") == (0, 9, 0) and preflight.vllm_version("dev") is None


@workspace
def test_gpu_loop_check_moe_commands(tmp_path):
    """`gpu_loop_check.py --moe`: for an MoE checkpoint (the tiny Qwen3-MoE fixture) vLLM is
    started with --enable-return-routed-experts and the loop with --routing-replay r3, and a
    vLLM older than 0.22.0 is not used; a dense checkpoint's commands have neither."""
    import gpu_loop_check

    moe, dense = ROOT / "tests/fixtures/tiny-qwen3-moe", ROOT / "tests/fixtures/tiny-qwen3"
    if not (moe / "config.json").exists():
        pytest.skip("tests/fixtures/tiny-qwen3-moe is not there yet (claw-rl init-tiny --moe)")
    args = gpu_loop_check.options(["--out", str(tmp_path / "x.json"), "--tiny", "--moe"])
    assert "--enable-return-routed-experts" in gpu_loop_check.vllm_command(args, moe)
    assert "--enable-return-routed-experts" not in gpu_loop_check.vllm_command(args, dense)
    argv = gpu_loop_check.loop_argv(args, tmp_path, moe, "vllm:http://127.0.0.1:8011", "x")
    assert argv[-2:] == ["--routing-replay", "r3"]
    assert "--routing-replay" not in gpu_loop_check.loop_argv(args, tmp_path, dense, "x", "x")
    assert (
        gpu_loop_check.vllm_too_old("0.21.0", moe) == "too old for routed experts: 0.21.0 < 0.22.0"
    )
    assert gpu_loop_check.vllm_too_old("0.22.0", moe) is None
    assert gpu_loop_check.vllm_too_old("0.21.0", dense) is None


# --- issue 41: one GPU box, vLLM sleeps while the learner trains (ENGINE_SLEEP=1) ---------------


@workspace
def test_launch_dry_run_engine_sleep_dense(tmp_path):
    """ENGINE_SLEEP=1: vLLM starts with --enable-sleep-mode (dev mode already on: its /sleep and
    /wake_up routes) and a larger share of the GPU (VLLM_MEM 0.60, unless set), the loop with
    --engine-sleep, and the dry run says so. ENGINE_SLEEP=0 is the default (no sleep flag,
    VLLM_MEM 0.45; without ENGINE_SLEEP the output is byte-identical, test above). vLLM and the
    learner on different GPUs, or a value other than 0/1, fail naming the variable."""
    tools, vllm = _tools(tmp_path), _fake_vllm(tmp_path, "0.22.0")
    default = _launch(tmp_path, tools, CLAWGYM, "--steps", "2", VLLM_PY=vllm, ENGINE_SLEEP="0")
    assert default.returncode == 0  # the output of no ENGINE_SLEEP (test above), byte for byte
    assert "sleep" not in default.stdout and "engine sleep" not in default.stderr
    assert "--gpu-memory-utilization 0.45 " in default.stdout

    done = _launch(tmp_path, tools, CLAWGYM, "--steps", "2", VLLM_PY=vllm, ENGINE_SLEEP="1")
    assert done.returncode == 0, done.stderr
    vllm_cmd, loop = [line for line in done.stdout.splitlines() if not line.startswith("#")]
    assert (
        vllm_cmd
        == default.stdout.splitlines()[1]
        .replace("--gpu-memory-utilization 0.45", "--gpu-memory-utilization 0.60")
        .rstrip()
        + " --enable-sleep-mode "
    )
    assert "VLLM_SERVER_DEV_MODE=1" in vllm_cmd
    assert "--pack batch --engine-sleep --suite" in loop
    assert loop.replace("--engine-sleep ", "") == default.stdout.splitlines()[3]
    assert "engine sleep: vLLM sleeps while the learner trains" in done.stderr
    assert "VLLM_MEM 0.60 of GPU 0" in done.stderr


@workspace
def test_launch_dry_run_engine_sleep_moe(tmp_path):
    """ENGINE_SLEEP=1 with an MoE checkpoint and VLLM_MEM set: that share, routed experts then
    sleep mode, --routing-replay r3 then --engine-sleep; the refusals fail before any check."""
    tools, vllm = _tools(tmp_path), _fake_vllm(tmp_path, "0.22.0")
    kw = dict(model="Qwen3-30B-A3B", config=QWEN3_30B_A3B, VLLM_PY=vllm, ENGINE_SLEEP="1")
    done = _launch(tmp_path, tools, CLAWGYM, VLLM_MEM="0.7", **kw)
    assert done.returncode == 0, done.stderr
    vllm_cmd, loop = [line for line in done.stdout.splitlines() if not line.startswith("#")]
    assert "--gpu-memory-utilization 0.7 " in vllm_cmd
    assert vllm_cmd.endswith("--enable-return-routed-experts --enable-sleep-mode ")
    assert "--routing-replay r3 --engine-sleep --suite" in loop

    done = _launch(tmp_path, tools, CLAWGYM, VLLM_GPUS="0", LEARNER_GPUS="1", **kw)
    assert done.returncode == 1 and not done.stdout
    assert "ENGINE_SLEEP=1 is for vLLM and the learner on the same GPU(s)" in done.stderr
    done = _launch(tmp_path, tools, CLAWGYM, VLLM_PY=vllm, ENGINE_SLEEP="yes")
    assert done.returncode == 1 and "ENGINE_SLEEP=yes: expected 0 or 1" in done.stderr


def _mix_loop():
    spec = importlib.util.spec_from_file_location(
        "mix_harness_rl", ROOT / "examples/mix_harness_rl.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@workspace
def test_loop_engine_sleep_option(capsys):
    """--engine-sleep needs a vllm: engine and synchronous rollouts; the loop sleeps vLLM at
    level 2 when new weights come in memory anyway, at level 1 with --weights disk or LoRA
    (the base must survive), and not at all without the flag."""
    m = _mix_loop()
    for argv in (
        ["--engine-sleep"],
        ["--engine-sleep", "--engine", "vllm:x", "--max-staleness", "1"],
    ):
        with pytest.raises(SystemExit):
            m.options(argv)
    assert "--engine-sleep" in capsys.readouterr().err

    class Admin:
        def __init__(self) -> None:
            self.levels: list[int] = []

        def sleep(self, level: int) -> dict:
            self.levels.append(level)
            return {"ok": True, "sleeping": level, "sleep_seconds": 0.0}

    admin, logs, vllm = Admin(), [], ["--engine", "vllm:http://127.0.0.1:1", "--engine-sleep"]
    for extra in (["--weights", "memory"], [], ["--weights", "memory", "--lora-rank", "4"]):
        assert m.sleep_engines(m.options([*vllm, *extra]), admin, logs.append)
    assert admin.levels == [2, 1, 1] and "engines asleep (level 2)" in logs[0]
    assert m.sleep_engines(m.options(["--engine", "vllm:x"]), admin, logs.append) is None
