"""LoRA (``lora_rank > 0``, the lora extra): only the adapter trains, every policy is a PEFT
adapter directory that peft loads on the base model, and a run continues from one."""

from __future__ import annotations

import json

import pytest
import torch
from claw_rl import Learner, SFTConfig
from claw_rl.checkpoint import save_policy
from claw_rl.cli import main
from claw_rl.errors import ClawError
from click.testing import CliRunner
from rl_testlib import sft_chain_rows as _rows
from rl_testlib import write_rows as _write

pytest.importorskip("peft", reason="the lora extra is not installed")


def _gap(x: list[list[float]], y: list[list[float]]) -> float:
    """The largest |difference| of two per-sample logprob lists."""
    return max(abs(a - b) for u, v in zip(x, y, strict=True) for a, b in zip(u, v, strict=True))


def test_cli_sft_lora_saves_adapter_dirs_and_resumes(tiny, tmp_path):
    """`claw-rl sft --lora-rank 4`: each policy/vN is a PEFT adapter directory (no whole model),
    config.toml records the rank, and --resume continues the versions from the adapter."""
    samples = _write(tmp_path / "s.jsonl", _rows())
    out = tmp_path / "run"
    args = ["sft", "--model", str(tiny), "--samples", str(samples), "-o", str(out)]
    r = CliRunner().invoke(main, [*args, "--lr", "1e-2", "--batch-size", "1", "--lora-rank", "4"])
    assert r.exit_code == 0, r.output
    assert [json.loads(x)["version"] for x in r.stdout.splitlines()] == [1, 2]
    v2 = out / "policy" / "v2"
    assert (v2 / "adapter_config.json").exists() and (v2 / "adapter_model.safetensors").exists()
    assert not (v2 / "model.safetensors").exists()  # a step pushes only the adapter
    assert (v2 / "adapter_model.safetensors").stat().st_size < (
        tiny / "model.safetensors"
    ).stat().st_size / 5
    adapter = json.loads((v2 / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["base_model_name_or_path"] == str(tiny.resolve())
    assert "lora_rank = 4" in (out / "config.toml").read_text()
    r = CliRunner().invoke(
        main, ["sft", "--resume", str(out), "--samples", str(samples), "-o", str(out)]
    )
    assert r.exit_code == 0, r.output
    assert [json.loads(x)["version"] for x in r.stdout.splitlines()] == [3]
    assert (out / "policy" / "v3" / "adapter_model.safetensors").exists()


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing`:FutureWarning")  # peft's call
def test_lora_step_changes_only_the_adapter_and_peft_serves_the_same_policy(tiny, tmp_path):
    """After a LoRA step the base weights are untouched, the policy moved, and base + saved
    adapter (peft, as an engine loads it) gives the learner's logprobs."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    clean = _rows()
    learner = Learner.sft(SFTConfig(lr=1e-2, lora_rank=4, lora_alpha=8), tiny)
    base = AutoModelForCausalLM.from_pretrained(str(tiny))
    before = learner.logprobs(clean)
    learner.step(clean)
    after = learner.logprobs(clean)
    assert _gap(before, after) > 1e-3
    frozen = {
        n.replace(".base_layer", ""): p
        for n, p in learner.policy.named_parameters()
        if "lora_" not in n
    }
    for name, p in base.named_parameters():
        assert torch.equal(frozen[name], p), name  # only the adapter moved
    policy = save_policy(learner, tmp_path / "v1")
    assert policy["version"] == 1
    served = PeftModel.from_pretrained(base, policy["path"]).merge_and_unload()
    reloaded = Learner.sft(SFTConfig(lr=1e-2), tiny)
    reloaded.policy = served
    got = reloaded.logprobs(clean)
    assert _gap(got, after) < 1e-4
    # the adapter directory continues as a LoRA run: the same policy
    again = Learner.sft(SFTConfig(lr=1e-2, lora_rank=4), policy["path"])
    assert _gap(again.logprobs(clean), after) < 1e-5


def test_adapter_dir_without_lora_rank_is_refused(tiny, tmp_path):
    """Starting full fine-tuning from an adapter directory says what to do instead."""
    learner = Learner.sft(SFTConfig(lora_rank=2), tiny)
    policy = save_policy(learner, tmp_path / "v0")
    with pytest.raises(ClawError, match="LoRA adapter directory.*lora_rank"):
        Learner.sft(SFTConfig(), policy["path"])


def test_unknown_lora_target_is_a_clear_error(tiny):
    """A target module the model does not have is named in the error."""
    with pytest.raises(ClawError, match="cannot attach a LoRA adapter.*no_such_proj"):
        Learner.sft(SFTConfig(lora_rank=2, lora_targets="no_such_proj"), tiny)
