"""launch.sh's input checks: the suite loads, every harness's binaries are on PATH, and what the
model is (dense or mixture of experts) and what it will cost.

    python examples/gpu/preflight.py --suite DIR --harness claude-code --harness openclaw-chat \\
        --model /models/Qwen3-30B-A3B --vllm-version 0.22.0

Prints what it found on stderr; exits 1 naming what is missing (a harness binary: install it
with ./dev/install-harnesses, which puts it in .tools/bin). With --model it prints one word on
stdout, `moe` or `dense`, for launch.sh: an MoE checkpoint (config.json's num_experts,
num_local_experts or n_routed_experts > 0, or a *Moe* architecture) gets vLLM's routed experts
and the learner's rollout routing replay. For it, the MoE facts (experts, top-k, MoE layers,
routing bytes per token and per call) are printed, and a vLLM older than 0.22.0 is refused.

Why 0.22.0: `--enable-return-routed-experts` (vLLM's EngineArgs.enable_return_routed_experts,
vllm/engine/arg_utils.py) came with vllm-project/vllm#28284 (merged January 2026), but only for
the offline engine (`CompletionOutput.routed_experts`); the OpenAI server, which claw-proxy's
vllm engine talks to, returns them (`prompt_routed_experts`, `choices[].routed_experts` of
/v1/completions) from 0.22.0 (vllm-project/vllm#38939, #39568).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

import claw_bench

#: the first vLLM whose OpenAI server returns routed experts (see the docstring)
MIN_VLLM_ROUTED = (0, 22, 0)
#: the routing bytes of one call are quoted at this many tokens (a long harness session)
CALL_TOKENS = 25_000
#: the loop's learner keeps weights, gradients and both AdamW moments in float32
LEARNER_BYTES_PER_PARAM = 16
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


class ModelError(Exception):
    """A model directory launch.sh cannot use; the message names file and field."""


def read_config(model: Path) -> dict:
    """``model``/config.json as a dict (the text model's, for a multimodal wrapper)."""
    path = model / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path}: {exc}") from exc
    if not isinstance(config, dict):
        raise ModelError(f"{path}: not a JSON object")
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else config


def _int(config: dict, key: str, default: int | None = None, where: str = "config.json") -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelError(f"{where}: field {key}: expected an integer, got {value!r}")
    return value


def moe_layers(config: dict, layers: int, where: str = "config.json") -> list[int]:
    """The decoder layers whose MLP is a sparse expert block, in model order."""
    if "n_routed_experts" in config:  # DeepSeek-V2/V3: dense first layers, then every freq-th
        first = _int(config, "first_k_dense_replace", 0, where)
        freq = _int(config, "moe_layer_freq", 1, where)
        return [i for i in range(layers) if i >= first and i % max(freq, 1) == 0]
    dense = config.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(isinstance(i, int) for i in dense):
        raise ModelError(f"{where}: field mlp_only_layers: expected a list of layer indices")
    step = _int(config, "decoder_sparse_step", 1, where)  # Qwen2/Qwen3-MoE's rule
    return [i for i in range(layers) if i not in dense and step > 0 and (i + 1) % step == 0]


def moe_shape(config: dict, where: str = "config.json") -> dict | None:
    """``{"experts": E, "top_k": K, "moe_layers": L, ...}`` of an MoE config, None when dense."""
    experts = next((config[k] for k in EXPERT_KEYS if config.get(k)), 0)
    archs = " ".join(a for a in config.get("architectures") or [] if isinstance(a, str))
    if not experts:
        if re.search(r"moe", archs, re.IGNORECASE):
            raise ModelError(
                f"{where}: architectures {archs} is a mixture of experts, but no field of "
                f"{', '.join(EXPERT_KEYS)} gives its number of experts"
            )
        return None
    key = next(k for k in EXPERT_KEYS if config.get(k))
    experts = _int(config, key, where=where)
    top_k = _int(config, "num_experts_per_tok", None, where)
    layers = _int(config, "num_hidden_layers", None, where)
    if experts < 1 or not 1 <= top_k <= experts:
        raise ModelError(f"{where}: field num_experts_per_tok: {top_k} is not in [1, {experts}]")
    which = moe_layers(config, layers, where)
    if not which:
        raise ModelError(f"{where}: {key} {experts} but no layer is an MoE layer")
    itemsize = 1 if experts <= 255 else 2  # the routing store: uint8, else int16
    per_token = len(which) * top_k * itemsize
    return {
        "experts": experts,
        "top_k": top_k,
        "moe_layers": len(which),
        "layers": layers,
        "dtype": "uint8" if itemsize == 1 else "int16",
        "routing_bytes_per_token": per_token,
        "routing_bytes_per_call": per_token * CALL_TOKENS,
    }


def parameters(config: dict, where: str = "config.json") -> dict:
    """Total and per-token active parameters of a Qwen3 / Qwen3-MoE style decoder (Llama
    layout: q/k/v/o projections, gated MLP or gated experts plus a linear router, RMS norms;
    other layouts, e.g. DeepSeek's MLA, are estimated as if they were this one)."""
    vocab, hidden = (
        _int(config, "vocab_size", None, where),
        _int(config, "hidden_size", None, where),
    )
    layers = _int(config, "num_hidden_layers", None, where)
    heads = _int(config, "num_attention_heads", None, where)
    kv_heads = _int(config, "num_key_value_heads", heads, where)
    head_dim = _int(config, "head_dim", hidden // heads, where)
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads) + 2 * head_dim + 2 * hidden
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings") else 2) + hidden
    moe = moe_shape(config, where)
    dense_mlp = 3 * hidden * _int(config, "intermediate_size", 0, where)
    total = active = embeddings + layers * attention
    sparse = set(moe_layers(config, layers, where)) if moe else set()
    for i in range(layers):
        if i not in sparse:
            total += dense_mlp
            active += dense_mlp
            continue
        inter = _int(config, "moe_intermediate_size", None, where)
        shared = 3 * hidden * _int(config, "shared_expert_intermediate_size", 0, where)
        router = moe["experts"] * hidden
        total += router + shared + moe["experts"] * 3 * hidden * inter
        active += router + shared + moe["top_k"] * 3 * hidden * inter
    return {"total": total, "active": active}


def vllm_version(text: str) -> tuple[int, ...] | None:
    """(major, minor, patch) of a vLLM version string ("0.22.1rc1.dev3+g..."), None if none."""
    found = re.match(r"\s*(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(x or 0) for x in found.groups()) if found else None


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def model_facts(model: Path, vllm: str | None) -> tuple[str, list[str], list[str]]:
    """``(kind, lines, problems)``: "moe" or "dense", what to print, and what refuses it."""
    where = str(model / "config.json")
    config = read_config(model)
    moe = moe_shape(config, where)
    archs = ", ".join(config.get("architectures") or []) or "no architectures"
    lines = [f"model {model}: {config.get('model_type', '?')} ({archs})"]
    try:
        n = parameters(config, where)
    except ModelError as exc:  # a config without the shape fields: no estimate, not fatal
        lines.append(f"no parameter estimate ({exc})")
    else:
        lines.append(
            f"parameters: {_count(n['total'])} total, {_count(n['active'])} active per "
            f"token; memory (all experts' weights): vLLM bf16 weights {_gib(2 * n['total'])}, "
            f"learner float32 weights + gradients + AdamW moments "
            f"{_gib(LEARNER_BYTES_PER_PARAM * n['total'])}"
        )
    if moe is None:
        return "dense", lines, []
    per_token, per_call = moe["routing_bytes_per_token"], moe["routing_bytes_per_call"]
    lines += [
        f"MoE: {moe['experts']} experts, top-{moe['top_k']}, {moe['moe_layers']} MoE layers of "
        f"{moe['layers']}: vLLM returns routed experts, the learner replays them (r3)",
        f"routing store: {moe['dtype']}, {per_token:,} bytes per token ({moe['moe_layers']} "
        f"layers x top-{moe['top_k']} x {1 if moe['dtype'] == 'uint8' else 2} B), "
        f"{per_call / 1e6:,.1f} MB per call of {CALL_TOKENS:,} tokens",
    ]
    need = ".".join(map(str, MIN_VLLM_ROUTED))
    found = vllm_version(vllm) if vllm else None
    if not vllm:
        lines.append(f"vLLM: not importable here, not checked (an MoE policy needs >= {need})")
        return "moe", lines, []
    if found is None or found < MIN_VLLM_ROUTED:
        return (
            "moe",
            lines,
            [
                f"vLLM {vllm} cannot return routed experts to claw-proxy: an MoE policy needs vLLM "
                f">= {need}, the first whose OpenAI server answers with them "
                f"(--enable-return-routed-experts); upgrade its venv: pip install -U 'vllm>={need}'"
            ],
        )
    lines.append(f"vLLM {vllm}: returns routed experts (>= {need})")
    return "moe", lines, []


def check_harnesses(suite_name: str, harnesses: list[str]) -> list[str]:
    """The problems with the suite and the harness binaries (what was found goes to stderr)."""
    problems = []
    try:
        suite = claw_bench.load_suite(suite_name)
    except claw_bench.ClawError as exc:
        problems.append(f"suite {suite_name}: {exc}")
    else:
        print(f"preflight: suite {suite_name}: {len(suite.tasks)} tasks", file=sys.stderr)
        for task_id, why in suite.skipped:
            print(f"preflight:   skipped {task_id}: {why}", file=sys.stderr)
        if not suite.tasks:
            problems.append(f"suite {suite_name}: no task loads")
    for name in harnesses:
        try:
            harness = claw_bench.load_harness(name)
        except claw_bench.ClawError as exc:
            problems.append(str(exc))
            continue
        missing = [b for b in harness.requires if shutil.which(b) is None]
        if missing:
            problems.append(
                f"harness {name}: {', '.join(missing)} not on PATH "
                "(run ./dev/install-harnesses; it installs into .tools/bin)"
            )
        else:
            found = ", ".join(f"{b} at {shutil.which(b)}" for b in harness.requires)
            print(f"preflight: harness {name}: {found or 'needs no binary'}", file=sys.stderr)
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", required=True, help="built-in suite name or a task directory")
    ap.add_argument("--harness", action="append", required=True, help="harness, repeatable")
    ap.add_argument("--model", type=Path, help="HF model directory: prints moe or dense")
    ap.add_argument("--vllm-version", default="", help="vLLM's version ('': not importable)")
    args = ap.parse_args(argv)
    problems, kind = [], None
    if args.model is not None:
        try:
            kind, lines, problems = model_facts(args.model, args.vllm_version.strip() or None)
        except ModelError as exc:
            problems, lines = [str(exc)], []
        for line in lines:
            print(f"preflight: {line}", file=sys.stderr)
    problems += check_harnesses(args.suite, args.harness)
    for problem in problems:
        print(f"preflight: MISSING: {problem}", file=sys.stderr)
    if kind and not problems:
        print(kind)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
