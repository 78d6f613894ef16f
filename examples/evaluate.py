"""Pass@k of a model across harnesses, and a before/after comparison -- the CLIs, JSONL between them.

    ./dev/demo                    # runs/quickstart: policy/sft (after SFT), policy/v8 (after RL)
    uv run python examples/evaluate.py --model runs/quickstart/policy/sft \
        --compare-model runs/quickstart/policy/v8 --tag toy-steps --tag heldout \
        --harness claw-agent-steps --harness claw-agent-steps-anthropic -n 4 \
        --max-new-tokens 48 -o runs/eval

    uv run python examples/evaluate.py --endpoint https://api.example.com --endpoint-key-env API_KEY ...

For each model: `claw-proxy serve` on it (transformers engine, or passthrough to an
OpenAI/Anthropic-compatible endpoint, recorded as not trainable), then
`claw-bench plan | claw-sandbox run | claw-bench score`, then `claw-bench report`.
With --compare-model the second model's report is printed against the first (before/after).
The first example compares the quickstart's SFT policy with its policy after 8 GRPO steps on the
32 held-out toy-steps instances, through both tool-calling harnesses, under the token cap they
were trained with. Measured after `./dev/demo` (seed 0), 128 rollouts per harness and model:
Pass@1 0.461 -> 0.938 (claw-agent-steps) and 0.477 -> 0.961 (Anthropic Messages), Pass@4
0.875 -> 1.000 and 0.906 -> 1.000; passk.png shows the before and after bars per harness. After
SFT most prompts pass on some of their 4 tries and RL makes them pass on the first. Every call
samples with a seed derived from --seed (`claw-proxy serve --seed`), so a rerun reports the same
numbers."""

from __future__ import annotations

import argparse
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--model", type=Path, help="HF model directory (transformers engine)")
p.add_argument(
    "--endpoint", help="instead of --model: an OpenAI/Anthropic-compatible base URL (passthrough)"
)
p.add_argument("--endpoint-key-env", help="environment variable holding the endpoint's API key")
p.add_argument(
    "--tokenizer", type=Path, help="tokenizer dir for --endpoint (chat template for rendering)"
)
p.add_argument(
    "--compare-model", type=Path, help="a second model directory, reported against the first"
)
p.add_argument("--suite", default="claw-toy")
p.add_argument(
    "--harness",
    action="append",
    help="repeatable (default: claw-agent-text, claw-agent-text-anthropic)",
)
p.add_argument("--task", action="append", help="only these tasks (repeatable)")
p.add_argument("--tag", action="append", help="only tasks carrying all these tags (repeatable)")
p.add_argument("-n", type=int, default=4, help="samples per (task, harness): Pass@k up to k = n")
p.add_argument("--backend", default="auto")
p.add_argument("--parallel", type=int, default=4)
p.add_argument("--max-new-tokens", type=int, default=64, help="proxy cap on tokens per call")
p.add_argument("--seed", type=int, default=0, help="sampling seed (per call: claw-proxy --seed)")
p.add_argument(
    "-o",
    "--output",
    dest="out",
    type=Path,
    default=Path("runs/eval"),
    help="directory for the records, the report and the plot",
)
args = p.parse_args()
if not args.model and not args.endpoint:
    p.error("give --model DIR or --endpoint URL")
harnesses = args.harness or ["claw-agent-text", "claw-agent-text-anthropic"]
bin_dir = Path(sys.executable).parent


def tool(name: str) -> str:
    return shutil.which(name) or str(bin_dir / name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- one evaluation: proxy up, plan | run | score, proxy down ----------------------------------


def evaluate(label: str, engine: str, tokenizer: Path | None) -> Path:
    d = args.out / label
    d.mkdir(parents=True, exist_ok=True)
    secret = d / "secret"
    secret.write_text(secrets.token_hex(16) + "\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = [
        tool("claw-proxy"),
        "serve",
        "--engine",
        engine,
        "--port",
        str(port),
        "--secret-file",
        str(secret),
        "--record",
        str(d / "calls.jsonl"),
        "--max-tokens-cap",
        str(args.max_new_tokens),
        "--default-max-tokens",
        str(args.max_new_tokens),
        "--seed",
        str(args.seed),
    ]
    if tokenizer:
        serve += ["--tokenizer", str(tokenizer)]
    if args.endpoint_key_env:
        serve += ["--upstream-key-env", args.endpoint_key_env]
    proxy = subprocess.Popen(serve)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proxy.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"claw-proxy did not come up for {label}")
            time.sleep(0.3)
        plan = [
            tool("claw-bench"),
            "plan",
            "-s",
            args.suite,
            "-n",
            str(args.n),
            "--proxy",
            url,
            "--proxy-secret-file",
            str(secret),
            "--run-id",
            label,
            "-o",
            str(d / "jobs.jsonl"),
        ]
        for h in harnesses:
            plan += ["-H", h]
        for t in args.task or []:
            plan += ["--task", t]
        for t in args.tag or []:
            plan += ["--tag", t]
        subprocess.run(plan, check=True)
        subprocess.run(
            [
                tool("claw-sandbox"),
                "run",
                str(d / "jobs.jsonl"),
                "-o",
                str(d / "runs.jsonl"),
                "--backend",
                args.backend,
                "--parallel",
                str(args.parallel),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        with (d / "outcomes.jsonl").open("w") as f:
            subprocess.run(
                [tool("claw-bench"), "score", str(d / "runs.jsonl")], check=True, stdout=f
            )
    finally:
        proxy.terminate()
        proxy.wait(timeout=30)
    return d / "outcomes.jsonl"


# --- before, after, report ---------------------------------------------------------------------
first = evaluate(
    "model",
    f"transformers:{args.model}" if args.model else f"passthrough:{args.endpoint}",
    args.tokenizer,
)
report = [tool("claw-bench"), "report", str(first), "-k", "1", "-k", str(args.n)]
if args.compare_model:
    second = evaluate("compare", f"transformers:{args.compare_model}", None)
    report = [
        tool("claw-bench"),
        "report",
        str(second),
        "-k",
        "1",
        "-k",
        str(args.n),
        "--compare",
        str(first),
    ]
subprocess.run([*report, "--plot", str(args.out / "passk.png")], check=True)
print(f"\nrecords in {args.out}/, plot {args.out / 'passk.png'}", file=sys.stderr)
