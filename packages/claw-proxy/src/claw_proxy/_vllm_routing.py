"""The experts a vLLM server routed each token to, read back for the `vllm:URL` engine.

vLLM (>= 0.22; the shape below is 0.32.0's) started with ``--enable-return-routed-experts``
answers a non-streamed ``/v1/completions`` call with ``choices[i].routed_experts``: the
base64 of a ``.npy`` file (``np.save``), an integer array (T, num_hidden_layers, K) with
T = len(prompt) + len(completion) - 1 (every token it forwarded: the last sampled one never
is), dtype uint8 for <= 256 experts, else uint16 (int32 in some builds). Its layer axis is
every decoder layer; a dense layer's column is never written (zeros). A streamed answer
carries no routing, so an engine that records routing asks without streaming.

`MoELayout` says which layers are MoE layers (the record's L axis, docs/formats.md, Routing
store); it comes from the policy's ``config.json``, as vLLM and transformers build the model:
Qwen-MoE's ``mlp_only_layers`` and ``decoder_sparse_step``, DeepSeek's
``first_k_dense_replace``. numpy is imported only where an array is decoded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from claw_proxy.errors import ConfigError, EngineError

EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


@attrs.frozen(kw_only=True)
class MoELayout:
    """An MoE model's routing shape: E experts, K per token, and which decoder layers route."""

    experts: int  # E
    top_k: int  # K
    layers: int  # decoder layers, dense ones included (vLLM's layer axis)
    moe_layers: tuple[int, ...]  # the MoE layers' indices in model order (the record's L axis)


def _count(cfg: dict, key: str, where: str, low: int) -> int:
    v = cfg.get(key)
    if type(v) is not int or v < low:
        raise ConfigError(f"{where}: field '{key}' must be an integer >= {low}, got {v!r}")
    return v


def moe_layout(config: dict, where: str) -> MoELayout | None:
    """The MoE layout a model config (``config.json``'s dict) describes; None for a dense
    model. Errors name `where` (the file) and the field."""
    cfg = config
    if not any(k in cfg for k in EXPERT_KEYS) and isinstance(cfg.get("text_config"), dict):
        cfg = cfg["text_config"]  # a multimodal wrapper: the language model's config
    key = next((k for k in EXPERT_KEYS if cfg.get(k)), None)
    if key is None:
        return None
    experts = _count(cfg, key, where, 1)
    top_k = _count(cfg, "num_experts_per_tok", where, 1)
    if top_k > experts:
        raise ConfigError(
            f"{where}: field 'num_experts_per_tok' is {top_k}, more than the {experts} experts"
        )
    layers = _count(cfg, "num_hidden_layers", where, 1)
    dense = cfg.get("mlp_only_layers") or []
    if not isinstance(dense, list) or any(type(i) is not int for i in dense):
        raise ConfigError(f"{where}: field 'mlp_only_layers' must be a list of layer indices")
    step = _count(cfg, "decoder_sparse_step", where, 1) if "decoder_sparse_step" in cfg else 1
    first = cfg.get("first_k_dense_replace") or 0
    if type(first) is not int or first < 0:
        raise ConfigError(f"{where}: field 'first_k_dense_replace' must be an integer >= 0")
    moe = tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0 and i >= first)
    if not moe:
        return None
    return MoELayout(experts=experts, top_k=top_k, layers=layers, moe_layers=moe)


def read_layout(model_dir: str | None) -> MoELayout | None:
    """The MoE layout of the HF model directory `model_dir` (its ``config.json``); None when
    there is no such file or it describes a dense model."""
    if not model_dir:
        return None
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: a model config must be a JSON object")
    return moe_layout(config, str(path))


def routed_experts_enabled(info: Any) -> bool:
    """Whether vLLM's ``/server_info`` (``config_format=json``) says it returns routed experts
    (0.32's ``aux_output_config``; earlier releases kept the flag in ``model_config``)."""
    try:
        config = info["vllm_config"]
    except (KeyError, TypeError):
        return False
    if not isinstance(config, dict):
        return False
    for section in ("aux_output_config", "model_config"):
        part = config.get(section)
        if isinstance(part, dict) and part.get("enable_return_routed_experts") is True:
            return True
    return False


def _malformed(what: str) -> EngineError:
    return EngineError(f"vLLM returned malformed routed_experts: {what}", status=502)


def _load_npy(value: Any):
    """The array in vLLM's base64 ``.npy`` string."""
    import base64
    import binascii
    import io

    import numpy as np

    if not isinstance(value, str):
        got = "null" if value is None else type(value).__name__
        raise _malformed(
            f"expected a base64 .npy string, got {got} (was vLLM started with "
            "--enable-return-routed-experts, and did the request run?)"
        )
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as e:
        raise _malformed(f"not base64 ({e})") from None
    try:
        return np.load(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise _malformed(f"not a .npy array ({e})") from None


def decode_routed_experts(value: Any, prompt_len: int, completion_len: int, moe: MoELayout):
    """A call's routing from a choice's ``routed_experts``: (P + C - 1, L, K) expert indices,
    the rows of ``prompt_ids + completion_ids[:-1]`` in order, the MoE layers' columns only,
    in the store's dtype (uint8 for <= 255 experts, else int16). Anything else vLLM sent (no
    array, another row count, layer count or K, values outside [0, E), an expert repeated in
    a row) is an `EngineError` (502) saying what was wrong."""
    import numpy as np

    from claw_proxy.routing import routing_dtype

    a = _load_npy(value)
    if a.ndim != 3 or a.dtype.kind not in "iu":
        raise _malformed(f"expected a 3-d integer array, got {a.ndim}-d {a.dtype}")
    t, layers, k = a.shape
    want = prompt_len + completion_len - 1
    if t != want:
        raise _malformed(
            f"{t} token rows, expected {want} (prompt {prompt_len} + completion "
            f"{completion_len} - 1: every token but the last sampled one)"
        )
    if k != moe.top_k:
        raise _malformed(f"{k} experts per token, the model routes {moe.top_k}")
    if layers == moe.layers:
        a = a[:, list(moe.moe_layers), :]
    elif layers != len(moe.moe_layers):
        raise _malformed(
            f"{layers} layers, the model has {moe.layers} decoder layers of which "
            f"{len(moe.moe_layers)} are MoE layers"
        )
    if a.size and (int(a.min()) < 0 or int(a.max()) >= moe.experts):
        raise _malformed(
            f"expert indices in [{int(a.min())}, {int(a.max())}], outside [0, {moe.experts})"
        )
    if k > 1 and a.size and bool((np.diff(np.sort(a, axis=2), axis=2) == 0).any()):
        raise _malformed("a (token, layer) row names the same expert twice")
    return np.ascontiguousarray(a, dtype=routing_dtype(moe.experts))
