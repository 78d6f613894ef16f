"""GPU check (issue 18): tree vs chain merge vs per-call update throughput at 16K and 64K tokens.

A random-initialised Qwen3-1.7B-architecture model in bf16 (no download) trains one GRPO
update (Learner.step: old-logprob pass + one optimizer step, micro-batch 1) on the same
session three ways (bench/rl_tree_shapes.py):

- tree: the session's prefix tree, one sample (block-sparse tree attention: flex_attention);
- chain merge: each root-to-leaf path as one sequence (causal SDPA);
- per call: each call's prompt + completion as one sequence (causal SDPA).

Per method: tokens forwarded, seconds, tokens/s, tree tokens/s (the same training content per
second) and peak GPU memory; per size the speedups and token ratios of tree over the others.
Decoder layers use activation checkpointing (a 64K-token forward of 28 layers does not fit
otherwise). Per call at 64K forwards ~1M tokens: when a method's tokens exceed --cap, an
evenly spaced subset of its sequences runs and the time is scaled to all of them (marked
"subset" in the JSON). The JSON is rewritten after every measurement, so a run cut short
still leaves what it measured.

Run: bench/gpu_check.sh (writes $OUT/gpu_check.json). CPU dry run of the same logic with a
tiny model: python bench/gpu_check.py --tiny --out /tmp/gpu_check.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rl_tree_shapes import chain_merge, per_call, session_tree  # noqa: E402

QWEN3_1_7B = dict(
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=6144,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    max_position_embeddings=65536,
)
TINY = dict(
    vocab_size=2048,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    tie_word_embeddings=True,
    max_position_embeddings=65536,
)


def build_model(out_dir: str, arch: dict, dtype: torch.dtype, device: str) -> str:
    """A random-weight Qwen3 model of ``arch`` saved to ``out_dir`` (weights in ``dtype``)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(Qwen3Config(**arch))
    model.to(dtype).save_pretrained(out_dir)
    del model
    return out_dir


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _peak_reset(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


def _peak_gib(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None


def _subset(samples: list[dict], cap: int) -> list[dict]:
    """Evenly spaced samples whose tokens stay within ``cap`` (all of them when they fit)."""
    total = sum(len(s["input_ids"]) for s in samples)
    if total <= cap:
        return samples
    step = -(-total // cap)
    return samples[::step]


def measure(learner, samples: list[dict], device: str, cap: int, warm: list[dict]) -> dict:
    """One update on ``samples`` (or a subset, scaled): tokens, seconds, tokens/s, peak memory."""
    learner.step(warm)  # compile / allocate outside the timed step
    run = _subset(samples, cap)
    tokens = sum(len(s["input_ids"]) for s in samples)
    run_tokens = sum(len(s["input_ids"]) for s in run)
    _sync(device)
    _peak_reset(device)
    t0 = time.perf_counter()
    learner.step(run)
    _sync(device)
    seconds = (time.perf_counter() - t0) * tokens / run_tokens
    return {
        "sequences": len(samples),
        "tokens": tokens,
        "measured_sequences": len(run),
        "measured_tokens": run_tokens,
        "subset": run is not samples,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "peak_gib": _peak_gib(device),
    }


def _attempt(learner, samples: list[dict], device: str, cap: int, warm: list[dict]) -> dict:
    """:func:`measure`, or {"error": ...} when it fails (the other methods still run)."""
    try:
        return measure(learner, samples, device, cap, warm)
    except Exception as exc:
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        return {"error": f"{type(exc).__name__}: {exc}"[:2000]}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--tiny", action="store_true", help="tiny model on CPU: a dry run of the logic")
    ap.add_argument("--sizes", type=int, nargs="+", help="tree tokens (default 16384 65536)")
    ap.add_argument("--cap", type=int, default=300_000, help="most tokens timed per method")
    ap.add_argument("--no-checkpointing", action="store_true", help="keep all activations")
    args = ap.parse_args(argv)
    import transformers
    from claw_rl import GRPOConfig, Learner, _tree_attention

    device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    arch, dtype = (TINY, "float32") if args.tiny else (QWEN3_1_7B, "bfloat16")
    sizes = args.sizes or ([2048, 4096] if args.tiny else [16384, 65536])
    started = time.perf_counter()
    report: dict = {
        "what": "one GRPO update (old logprobs + optimizer step): tree vs chain merge vs per call",
        "model": ("tiny Qwen3" if args.tiny else "Qwen3-1.7B architecture") + ", random init",
        "dtype": dtype,
        "activation_checkpointing": not args.no_checkpointing,
        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cap_tokens": args.cap,
        "tree_kernel": "flex_attention" if device == "cuda" else "chunked (CPU)",
        "sizes": {},
    }

    def write() -> None:
        report["wall_s"] = time.perf_counter() - started
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(os.path.join(tmp, "model"), arch, getattr(torch, dtype), device)
        cfg = GRPOConfig(lr=1e-6, micro_batch_size=1, dtype=dtype)
        learner = Learner.grpo(cfg, model_dir, device=device)
        if not args.no_checkpointing:
            policy = learner.policy  # transformers >= 5.2x renamed the method
            enable = getattr(policy, "activation_checkpointing_enable", None)
            (enable or policy.gradient_checkpointing_enable)({"use_reentrant": False})
            learner.policy.train()  # checkpointing acts in train mode; Qwen3 has no dropout
        report["setup_s"] = time.perf_counter() - started
        write()
        for n in sizes:
            tree = session_tree(n, vocab=arch["vocab_size"] - 1)
            runs = {"tree": [tree], "chain_merge": chain_merge(tree), "per_call": per_call(tree)}
            row: dict = {}
            report["sizes"][str(n)] = row
            for name, samples in runs.items():
                warm = [tree] if name == "tree" else samples[:1]
                row[name] = _attempt(learner, samples, device, args.cap, warm)
                flex = device == "cuda" and _tree_attention.FLEX_ON_CUDA
                if "error" in row[name] and name == "tree" and flex:
                    _tree_attention.FLEX_ON_CUDA = False  # flex failed: the chunked kernel
                    report["tree_kernel"] = "chunked (flex_attention failed)"
                    flex_error = row[name]["error"]
                    row[name] = _attempt(learner, samples, device, args.cap, warm)
                    row[name]["flex_error"] = flex_error
                write()
                print(f"{n} {name}: {json.dumps(row[name])}", file=sys.stderr, flush=True)
            t = row["tree"]
            for other in ("chain_merge", "per_call"):
                o = row[other]
                if "error" in t or "error" in o:
                    continue
                row[f"{other}_token_ratio"] = o["tokens"] / t["tokens"]
                row[f"{other}_speedup"] = o["seconds"] / t["seconds"]
                row[f"{other}_speedup_over_token_ratio"] = (o["seconds"] / t["seconds"]) / (
                    o["tokens"] / t["tokens"]
                )
            write()
    return report


if __name__ == "__main__":
    main()
