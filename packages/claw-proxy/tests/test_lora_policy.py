"""The transformers engine serves a LoRA adapter policy (a `claw-rl --lora-rank` policy
directory) as its base model + the adapter, merged, and reports the policy's version."""

from __future__ import annotations

import asyncio
import sys

import pytest
from claw_proxy.errors import ConfigError
from claw_proxy.records import Policy
from proxy_testlib import TINY

pytest.importorskip("torch", reason="the transformers extra is not installed")


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    """A rank-2 adapter on the tiny model with non-zero B (it changes the logits)."""
    pytest.importorskip("peft", reason="the lora extra is not installed")
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    d = tmp_path_factory.mktemp("adapter")
    base = AutoModelForCausalLM.from_pretrained(str(TINY))
    model = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    model.save_pretrained(d)
    return d


def _logits(model, ids):
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing`:FutureWarning")
def test_transformers_engine_loads_base_plus_adapter(adapter):
    """load_policy on an adapter directory: the served model is base + adapter (peft's merged
    model, to 1e-5) and differs from the base; the policy version is the record's."""
    from claw_proxy._transformers import TransformersEngine
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    engine = TransformersEngine(str(TINY))
    try:
        base_model, _ = engine._current
        asyncio.run(engine.load_policy(Policy(name="tiny", version=3, path=str(adapter))))
        served, policy = engine._current
        assert policy == {"name": "tiny", "version": 3} and engine.policy == policy
        ids = [5, 17, 99, 3, 250, 8]
        want = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(str(TINY)), str(adapter)
        ).merge_and_unload()
        assert (_logits(served, ids) - _logits(want, ids)).abs().max() < 1e-5
        assert (_logits(served, ids) - _logits(base_model, ids)).abs().max() > 1e-3
    finally:
        asyncio.run(engine.aclose())


def test_adapter_without_peft_says_what_to_install(adapter, monkeypatch):
    """Without peft an adapter policy is refused with the extra to install."""
    from claw_proxy._transformers import _load_adapter

    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(ConfigError, match=r"LoRA adapter directory.*claw-proxy\[lora\]"):
        _load_adapter(str(TINY), str(adapter), "float32")


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing`:FutureWarning")
def test_engine_started_on_an_adapter_serves_its_base_plus_adapter(adapter, tmp_path):
    """`transformers:ADAPTER_DIR` (a LoRA run's latest policy) starts on the base the adapter
    names, merged, with the base's tokenizer; an adapter whose base is not here, or whose config
    is cut off, is refused with the file named."""
    import json

    from claw_proxy._transformers import TransformersEngine

    want = TransformersEngine(str(TINY))
    try:
        asyncio.run(want.load_policy(Policy(name="tiny", version=1, path=str(adapter))))
        engine = TransformersEngine(str(adapter))
        try:
            assert engine.base_dir == str(TINY) and engine.tokenizer_dir == str(TINY)
            ids = [5, 17, 99, 3, 250, 8]
            got = _logits(engine._current[0], ids) - _logits(want._current[0], ids)
            assert got.abs().max() < 1e-5
        finally:
            asyncio.run(engine.aclose())
    finally:
        asyncio.run(want.aclose())
    orphan = tmp_path / "orphan"
    orphan.mkdir()
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = str(tmp_path / "gone")
    (orphan / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"adapter_config.json: base_model_name_or_path = .*gone"):
        TransformersEngine(str(orphan))
    (orphan / "adapter_config.json").write_text('{"base_model_name_or_path": ')  # cut off
    with pytest.raises(ConfigError, match=r"adapter_config.json: not a readable PEFT adapter"):
        TransformersEngine(str(orphan))
