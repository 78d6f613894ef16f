"""claw-rl: one learner update with a LoRA adapter (rank 8, every linear layer) vs full
fine-tuning, on the tiny model and the wide one (as in bench/test_rl_tree_vs_chain.py).

Reported per model: step time of each (best of 3) and their ratio; the training state each
holds beyond the frozen weights (trainable parameters + their gradients + AdamW's two moments,
counted from the tensors) and its ratio; on a GPU also the peak allocated memory of a step.
No timing asserts: the numbers go to extra_info and stdout.

Run: .venvs/claw-rl/bin/python -m pytest bench/test_rl_lora.py --benchmark-only -s
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
from claw_rl import GRPOConfig, Learner, init_tiny

pytest.importorskip("peft", reason="the lora extra is not installed")
SAMPLES, LENGTH = 4, 384
# as bench/test_rl_tree_vs_chain.py: the default tiny model and a wider one (width 512, 4 layers)
MODELS = {
    "tiny": {},
    "wide": dict(
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
    ),
}


def _samples(vocab: int) -> list[dict]:
    rng = np.random.default_rng(0)
    out = []
    for k in range(SAMPLES):
        trainable = [0] * (LENGTH // 2) + [1] * (LENGTH - LENGTH // 2)
        out.append(
            {
                "schema": "claw.sample/v1",
                "sample_id": f"s{k}",
                "algo": "grpo",
                "input_ids": rng.integers(3, vocab, LENGTH).tolist(),
                "position_ids": list(range(LENGTH)),
                "parent": list(range(-1, LENGTH - 1)),
                "trainable": trainable,
                "logprobs": [0.0] * LENGTH,
                "advantages": [float(rng.uniform(-1, 1)) * t for t in trainable],
                "loss_weights": [t / (SAMPLES * (LENGTH - LENGTH // 2)) for t in trainable],
            }
        )
    return out


def _state_bytes(learner: Learner) -> int:
    """Trainable parameters, their gradients and AdamW's exp_avg / exp_avg_sq, in bytes."""
    params = learner.params()
    n = sum(p.numel() * p.element_size() for p in params)
    moments = sum(
        t.numel() * t.element_size()
        for s in learner.optimizer.state.values()
        for t in s.values()
        if torch.is_tensor(t) and t.dim() > 0
    )
    return 2 * n + moments


def _measure(model, samples, lora_rank: int) -> dict:
    learner = Learner.grpo(GRPOConfig(lr=1e-5, micro_batch_size=2, lora_rank=lora_rank), model)
    learner.step(samples)  # warm-up; creates the optimizer state
    times, peak = [], None
    for _ in range(3):
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        learner.step(samples)
        times.append(time.perf_counter() - t0)
        if torch.cuda.is_available():
            peak = torch.cuda.max_memory_allocated()
    return {
        "step_s": min(times),
        "trainable": sum(p.numel() for p in learner.params()),
        "state_mb": _state_bytes(learner) / 2**20,
        "peak_cuda_mb": peak / 2**20 if peak is not None else None,
    }


@pytest.mark.parametrize("name", sorted(MODELS))
def test_lora_vs_full_step(benchmark, tmp_path, name):
    """Step time and training-state memory of LoRA (rank 8) vs full fine-tuning."""
    from claw_rl.tiny import TinySpec

    model = init_tiny(tmp_path / name, TinySpec(**MODELS[name]))
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    samples = _samples(vocab)
    full = _measure(model, samples, 0)
    lora = benchmark.pedantic(lambda: _measure(model, samples, 8), rounds=1, iterations=1)
    ratios = {
        "time_ratio": lora["step_s"] / full["step_s"],
        "state_ratio": lora["state_mb"] / full["state_mb"],
    }
    if full["peak_cuda_mb"] is not None:
        ratios["peak_ratio"] = lora["peak_cuda_mb"] / full["peak_cuda_mb"]
    benchmark.extra_info.update(full=full, lora=lora, **ratios)
    print(f"\n{name}: full {full} | lora {lora} | {ratios}")
    assert lora["trainable"] < full["trainable"]  # only the adapter trains
