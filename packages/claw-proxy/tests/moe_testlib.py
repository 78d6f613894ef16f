"""A tiny random Qwen3-MoE model for the routing tests (built here with transformers, so
claw-proxy's tests need no other package), and the reference: the experts a plain forward
pass over a token sequence routes each token to."""

from __future__ import annotations

import shutil
from pathlib import Path

from proxy_testlib import TINY


def build_tiny_moe(
    directory: Path, *, layers: int = 3, dense: tuple[int, ...] = (1,), experts: int = 8, k: int = 2
) -> Path:
    """A Qwen3-MoE with the tiny model's tokenizer and chat template: `layers` decoder layers,
    those in `dense` with a dense MLP (so L = layers - len(dense) MoE layers)."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        vocab_size=2078,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=experts,
        num_experts_per_tok=k,
        norm_topk_prob=True,
        mlp_only_layers=list(dense),
        decoder_sparse_step=1,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=2,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():  # routers far from ties: top-k is the same for every batch shape
        for layer in model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None and hasattr(gate, "top_k"):
                gate.weight.normal_(0.0, 0.5)
    model.save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(TINY / name, directory / name)
    shutil.copy(TINY / "generation_config.json", directory / "generation_config.json")
    return directory


def reference_routing(model, ids: list[int]):
    """The experts a single-row forward pass over `ids` routes every token to: (T, L, K),
    each row the router's top-k, largest weight first."""
    import torch

    got: list = []
    gates = [layer.mlp.gate for layer in model.model.layers if hasattr(layer.mlp, "gate")]
    handles = [g.register_forward_hook(lambda m, a, out: got.append(out[2])) for g in gates]
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()
    return torch.stack(got, dim=1).numpy()  # (T, L, K)
