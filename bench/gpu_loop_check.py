"""GPU real-loop smoke (issue 28): vLLM + the learner on one GPU, one harness, 2 RL steps.

The real loop (examples/mix_harness_rl.py, in this process) on claw-toy: a small random-weight
Qwen3 policy made here by claw_rl.init_tiny (no download: the GPU machine has no network),
served by vLLM on the GPU with the claw worker extension (examples/gpu/claw_vllm_worker.py:
weights reloaded in place after every step), recorded by claw-proxy, trained by claw-rl's GRPO
learner on the same GPU. One harness runs the rollouts in the process backend: claude-code when
its binary is installed (./dev/install-harnesses) and vLLM serves, else claw-agent-text; the
JSON says which and why. When vLLM cannot be imported (or does not start), the JSON says so
("vllm": "missing" / "failed: ...") and the loop runs on claw-proxy's in-process transformers
engine instead (it loads the policy on the CPU; the learner still trains on the GPU).

One JSON file, rewritten after every step so a run cut short still reports: the setup (device,
versions, model shape, engine, harness), per step the seconds of rollouts, training, saving and
the engine's weight reload, Pass@1 and reward of the step's rollouts, and the total wall time.

Run: bench/gpu_check.sh --loop (writes $OUT/gpu_loop_check.json). CPU dry run, 2 steps with the
transformers engine and claw-agent-text (about a minute):
    .venvs/workspace/bin/python bench/gpu_loop_check.py --tiny --out /tmp/gpu_loop_check.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: ~150M parameters: big enough that vLLM and the learner do real GPU work, small enough to
#: build, serve and train twice within the 10 minutes
SMALL = dict(
    vocab_size=8192, hidden_size=1024, intermediate_size=3072, num_hidden_layers=12,
    num_attention_heads=16, num_key_value_heads=8, head_dim=64,
)  # fmt: skip
#: --moe: every layer a Qwen3-MoE block of 16 experts, top-4 (tiny: init_tiny's 8, top-2)
SMALL_MOE = dict(num_experts=16, num_experts_per_tok=4, moe_intermediate_size=768)
TINY_MOE = dict(num_experts=8, num_experts_per_tok=2)
STEP_LINE = re.compile(r"^step (\d+): reward")
sys.path.insert(0, str(ROOT / "examples/gpu"))
import preflight  # noqa: E402  (examples/gpu/preflight.py: MoE detection, vLLM version rule)


def options(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--tiny", action="store_true", help="CPU dry run: tiny model, transformers")
    ap.add_argument("--steps", type=int, default=2, help="RL steps")
    ap.add_argument("--harness", default="auto", help="auto, claude-code, claw-agent-text, ...")
    ap.add_argument("--engine", choices=["auto", "vllm", "transformers"], default="auto")
    ap.add_argument("--moe", action="store_true", help="a Qwen3-MoE policy: routed experts, R3")
    ap.add_argument("--tasks-per-step", type=int, help="claw-toy tasks per step (tiny: 2, else 6)")
    ap.add_argument("--rollouts", type=int, help="rollouts per task per step (tiny: 2, else 8)")
    ap.add_argument("--vllm-python", default=os.environ.get("VLLM_PY", sys.executable))
    ap.add_argument("--vllm-port", type=int, default=8011)
    ap.add_argument("--vllm-mem", type=float, default=0.3, help="--gpu-memory-utilization")
    ap.add_argument("--vllm-timeout", type=float, default=240, help="seconds to become healthy")
    ap.add_argument("--work-dir", type=Path, help="keep the model and run here (default: temp)")
    args = ap.parse_args(argv)
    args.tasks_per_step = args.tasks_per_step or (2 if args.tiny else 6)
    args.rollouts = args.rollouts or (2 if args.tiny else 8)
    return args


# --- what this machine has -----------------------------------------------------------------------


def vllm_status(python: str) -> str:
    """vLLM's version as `python` imports it, or "missing" (never installed from here)."""
    probe = [python, "-c", "import vllm; print(vllm.__version__)"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return "missing"
    return done.stdout.strip() if done.returncode == 0 else "missing"


def tools_on_path() -> None:
    """Put the checkout's harness installs (./dev/install-harnesses: .tools/bin, or
    $CLAW_TOOLS/bin) first on PATH: the sandbox's jobs get this PATH."""
    tools = Path(os.environ.get("CLAW_TOOLS", ROOT / ".tools")) / "bin"
    if tools.is_dir():
        os.environ["PATH"] = os.pathsep.join(filter(None, [str(tools), os.environ.get("PATH")]))


def harness_binary(name: str) -> str | None:
    """Where the binary of harness `name` is on PATH, or None."""
    import claw_bench

    found = [shutil.which(b) for b in claw_bench.load_harness(name).requires]
    return found[0] if found and all(found) else None


def choose_harness(requested: str, engine: str) -> tuple[str, str]:
    """The harness and why: claude-code when it is installed and vLLM serves (its ~26K-token
    prompt is minutes per call on the CPU engine), else claw-agent-text."""
    if requested != "auto":
        return requested, "requested with --harness"
    if engine != "vllm":
        return "claw-agent-text", "no vLLM: Claude Code's ~26K-token prompts are too slow on CPU"
    if where := harness_binary("claude-code"):
        return "claude-code", f"claude found at {where}"
    return "claw-agent-text", "claude not installed (./dev/install-harnesses; needs Node >= 22)"


def missing_modules() -> list[str]:
    """The claw packages' third-party modules this Python lacks (torch and transformers aside)."""
    import importlib.util

    needed = "attrs click numpy safetensors tokenizers httpx starlette uvicorn jinja2 yaml rich"
    return [m for m in needed.split() if importlib.util.find_spec(m) is None]


def harness_arg(name: str, work: Path) -> str:
    """`name`, or the path of a copy of its adapter that keeps PYTHONPATH: the sandbox gives a
    job a clean environment, and a harness run as `{{python}} -m claw_bench...` must import the
    claw packages of this checkout where they are not installed (the GPU machine)."""
    from claw_bench.harnesses import harness_dirs

    pythonpath = os.environ.get("PYTHONPATH")
    found = [d / f"{name}.toml" for d in harness_dirs() if (d / f"{name}.toml").is_file()]
    text = found[0].read_text() if found else ""
    if not pythonpath or "{{python}}" not in text:
        return name
    line = f"PYTHONPATH = {json.dumps(pythonpath)}\n"
    text = (
        text.replace("[env]\n", "[env]\n" + line)
        if "[env]\n" in text
        else text + "\n[env]\n" + line
    )
    path = work / "harnesses" / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


# --- vLLM on the GPU -----------------------------------------------------------------------------


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def is_moe(model: Path) -> bool:
    """Whether `model`'s config.json is a mixture of experts (launch.sh's rule: preflight.py)."""
    return preflight.moe_shape(preflight.read_config(model), str(model / "config.json")) is not None


def vllm_command(args, model: Path) -> list[str]:
    """vLLM's server command for `model` as launch.sh builds it on one GPU: an MoE model's
    returns each call's routed experts."""
    cmd = [
        args.vllm_python, "-m", "vllm.entrypoints.openai.api_server",
        "--worker-extension-cls", "claw_vllm_worker.ClawWorkerExtension", "--model", str(model),
        "--host", "127.0.0.1", "--port", str(args.vllm_port), "--max-model-len", "32768",
        "--gpu-memory-utilization", str(args.vllm_mem), "--enable-prefix-caching",
        "--logprobs-mode", "processed_logprobs",
    ]  # fmt: skip
    return cmd + ["--enable-return-routed-experts"] if is_moe(model) else cmd


def vllm_too_old(version: str, model: Path) -> str | None:
    """Why this vLLM cannot serve `model` for the loop (an MoE needs routed experts), or None."""
    found = preflight.vllm_version(version)
    if not is_moe(model) or (found is not None and found >= preflight.MIN_VLLM_ROUTED):
        return None
    need = ".".join(map(str, preflight.MIN_VLLM_ROUTED))
    return f"too old for routed experts: {version} < {need}"


@contextlib.contextmanager
def vllm_server(args, model: Path, log_path: Path):
    """vLLM serving `model` as examples/gpu/launch.sh starts it; yields None, or the reason it
    did not become healthy within --vllm-timeout (its log's tail)."""
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1")
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT / "examples/gpu"), env.get("PYTHONPATH")])
    )
    cmd = vllm_command(args, model)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + args.vllm_timeout
        while not _healthy(args.vllm_port) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(1)
        if _healthy(args.vllm_port):
            yield None
        else:
            yield "failed: " + log_path.read_text(errors="replace")[-1500:]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


# --- the loop, timed -----------------------------------------------------------------------------


@contextlib.contextmanager
def timed_reloads(into: list[float]):
    """Every claw-proxy AdminClient.reload's load_seconds appended to `into` (the loop's
    metrics row has no reload time: the proxy reloads after the row is written)."""
    import claw_proxy

    original = claw_proxy.AdminClient.reload

    def reload(self, policy):
        t0 = time.monotonic()
        answer = original(self, policy)
        into.append(round(answer.get("load_seconds", time.monotonic() - t0), 3))
        return answer

    claw_proxy.AdminClient.reload = reload
    try:
        yield
    finally:
        claw_proxy.AdminClient.reload = original


def step_entry(row: dict, reload_s: float | None) -> dict:
    """The JSON's view of one metrics.jsonl row."""
    t = row.get("time", {})
    return {
        "step": row["step"],
        "policy_version": row["policy_version"],
        "rollout_s": row.get("rollout_s"),
        # 0: no model call answered (a harness that cannot start, an engine that does not serve)
        "completion_tokens": round(row.get("rollout_tokens_per_s", 0) * row.get("rollout_s", 0)),
        "train_s": t.get("train_s"),
        "save_policy_s": t.get("save_policy_s"),
        "checkpoint_s": t.get("checkpoint_s"),
        "data_s": t.get("data_s"),
        "reload_s": reload_s,
        "pass@1": row.get("pass@1"),
        "reward": row.get("reward"),
        "rollouts": row.get("rollouts"),
        "rollouts_failed": row.get("rollouts_failed"),
        "tree_token_ratio": row.get("tree_token_ratio"),
        "no_signal": bool(row.get("no_signal")),
    }


def loop_argv(args, run: Path, model: Path, engine: str, harness: str) -> list[str]:
    """examples/mix_harness_rl.py's options for the smoke."""
    argv = [
        "--run-dir", str(run), "--model", str(model), "--suite", "claw-toy", "--harness", harness,
        "--steps", str(args.steps), "--tasks-per-step", str(args.tasks_per_step),
        "--rollouts", str(args.rollouts), "--backend", "process", "--parallel", "4",
        "--pack", "batch", "--epochs", "1", "--minibatches", "1", "--seed", "0",
        "--max-new-tokens", "24" if args.tiny else "256", "--lr", "1e-2" if args.tiny else "1e-5",
    ]  # fmt: skip
    if engine.startswith("vllm:"):
        argv += ["--engine", engine, "--tokenizer", str(model)]
    if is_moe(model):  # the learner replays the engine's routed experts
        argv += ["--routing-replay", "r3"]
    return argv


def run_loop(report: dict, write, argv: list[str], run: Path) -> None:
    """The loop in this process; after each step its entry goes into the JSON."""
    sys.path.insert(0, str(ROOT / "examples"))
    import mix_harness_rl

    reloads: list[float] = []
    t0 = time.monotonic()

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)
        if STEP_LINE.match(msg):  # logged after the step's row is written and the reload done
            rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
            report["initial_reload_s"] = reloads[0] if reloads else None
            report["steps"] = [
                step_entry(r, reloads[i + 1] if i + 1 < len(reloads) else None)
                for i, r in enumerate(rows)
            ]
            report["loop_s"] = round(time.monotonic() - t0, 2)
            write()

    with timed_reloads(reloads):
        mix_harness_rl.main(argv, log=log)


def setup_report(args) -> dict:
    import torch
    import transformers

    cuda = torch.cuda.is_available() and not args.tiny
    return {
        "what": "RL loop smoke: claw-toy, rollouts -> trees -> GRPO update -> weight reload",
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        "learner_device": "cuda" if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "steps_planned": args.steps,
        "tasks_per_step": args.tasks_per_step,
        "rollouts_per_task": args.rollouts,
        "steps": [],
    }


def main(argv: list[str] | None = None) -> dict:
    args = options(argv)
    started = time.perf_counter()
    report = setup_report(args)

    def write() -> None:
        report["wall_s"] = round(time.perf_counter() - started, 2)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")

    write()
    if missing := missing_modules():
        report["error"] = f"python modules missing: {' '.join(missing)} (see bench/gpu_check.sh)"
        write()
        raise SystemExit(f"gpu_loop_check: {report['error']}")
    import claw_rl

    with contextlib.ExitStack() as stack:
        work = args.work_dir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        model, run = work / "model", work / "run"
        moe = (TINY_MOE if args.tiny else SMALL_MOE) if args.moe else {}
        spec = claw_rl.TinySpec(**moe) if args.tiny else claw_rl.TinySpec(**SMALL, **moe)
        claw_rl.init_tiny(model, spec)
        report["model"] = {"random_init": True, **{k: getattr(spec, k) for k in SMALL}}
        if is_moe(model):
            report["model"]["moe"] = preflight.moe_shape(preflight.read_config(model))
        report["setup_s"] = round(time.perf_counter() - started, 2)
        want_vllm = args.engine == "vllm" or (args.engine == "auto" and not args.tiny)
        report["vllm"] = vllm_status(args.vllm_python) if want_vllm else "not used (--tiny)"
        engine = "transformers"
        served = report["vllm"] not in ("missing", "not used (--tiny)")
        if served and (old := vllm_too_old(report["vllm"], model)):
            report["vllm"], served = old, False  # the loop runs on the transformers engine
        if served:
            t0 = time.perf_counter()
            failed = stack.enter_context(vllm_server(args, model, work / "vllm.log"))
            report["vllm_start_s"] = round(time.perf_counter() - t0, 2)
            if failed:
                report["vllm"] = failed
            else:
                engine = f"vllm:http://127.0.0.1:{args.vllm_port}"
        report["engine"] = engine
        if engine == "transformers":
            report["engine_note"] = "claw-proxy's in-process transformers engine (on the CPU)"
        tools_on_path()
        report["harness"], report["harness_reason"] = choose_harness(
            args.harness, engine.split(":")[0]
        )
        write()
        try:
            run_loop(
                report,
                write,
                loop_argv(args, run, model, engine, harness_arg(report["harness"], work)),
                run,
            )
        except BaseException as exc:  # the JSON says how it ended, then the error goes on
            report["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            raise
        finally:
            report["done"] = len(report["steps"]) == args.steps
            report["ok"] = report["done"] and all(
                s["completion_tokens"] > 0 and not s["rollouts_failed"] for s in report["steps"]
            )
            write()
    return report


if __name__ == "__main__":
    main()
