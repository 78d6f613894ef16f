"""The tiny model maker: offline loading, the chat template, determinism."""

import hashlib
from pathlib import Path

import pytest
import torch
from claw_rl import ClawError, TinySpec, init_tiny
from transformers import AutoModelForCausalLM, AutoTokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return init_tiny(tmp_path_factory.mktemp("m") / "tiny")


def test_loads_offline_with_auto_classes(tiny, monkeypatch):
    """Model and tokenizer load with the Auto classes with the hub switched off."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tok = AutoTokenizer.from_pretrained(tiny)
    model = AutoModelForCausalLM.from_pretrained(tiny)
    assert model.config.model_type == "qwen3"
    assert model.config.head_dim >= 32
    assert model.config.vocab_size == len(tok)
    assert tok.eos_token == "<|im_end|>" and model.config.eos_token_id == tok.eos_token_id
    ids = torch.tensor([tok.encode("hello world")])
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok))


def test_chat_template_renders_tools_calls_and_results(tiny):
    """System, tools, assistant tool calls, grouped tool results and a mid-conversation system turn."""
    tok = AutoTokenizer.from_pretrained(tiny)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "list files"}]},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "1",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command": "ls"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "1", "content": "a.txt"},
        {"role": "tool", "tool_call_id": "2", "content": "b.txt"},
        {"role": "system", "content": "reminder"},
    ]
    text = tok.apply_chat_template(
        messages, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert '\n<tools>\n{"type": "function", "function": {"name": "bash"' in text
    assert "<|im_start|>user\nlist files<|im_end|>\n" in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>\n'
        in text
    )
    assert (
        "<|im_start|>user\n<tool_response>\na.txt\n</tool_response>\n<tool_response>\nb.txt\n</tool_response><|im_end|>\n"
        in text
    )
    assert text.endswith("<|im_start|>system\nreminder<|im_end|>\n<|im_start|>assistant\n")


def test_markup_tokens_are_single_ids_and_decode_back(tiny):
    """<tool_call> and friends are one token each and survive decoding."""
    tok = AutoTokenizer.from_pretrained(tiny)
    for marker in ["<tool_call>", "</tool_call>", "<tool_response>", "<|im_end|>"]:
        assert len(tok.encode(marker)) == 1, marker
    text = '<tool_call>\n{"name": "bash"}\n</tool_call>'
    assert tok.decode(tok.encode(text)) == text


def test_same_seed_same_files(tmp_path):
    """Two runs with the same seed write byte-identical tokenizer and weights."""
    spec = TinySpec(seed=3, num_hidden_layers=1)
    a, b = init_tiny(tmp_path / "a", spec), init_tiny(tmp_path / "b", spec)
    for name in ["tokenizer.json", "model.safetensors", "config.json"]:
        assert (
            hashlib.sha256((a / name).read_bytes()).digest()
            == hashlib.sha256((b / name).read_bytes()).digest()
        ), name


def test_refuses_non_empty_directory(tmp_path):
    """An existing non-empty directory is never overwritten."""
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("data")
    with pytest.raises(ClawError, match="not empty"):
        init_tiny(tmp_path / "x")
    assert (tmp_path / "x" / "keep.txt").read_text() == "data"


def test_split_digits_gives_one_token_per_digit(tmp_path):
    """With split_digits every number is one token per digit (as Qwen's tokenizer splits them),
    and decodes back; without it, BPE merges some digit pairs."""
    tok = AutoTokenizer.from_pretrained(
        init_tiny(tmp_path / "d", TinySpec(num_hidden_layers=1, split_digits=True))
    )
    for n in (7, 42, 100, 447, 999, 2026):
        ids = tok.encode(f'"content": "{n}"')
        pieces = tok.convert_ids_to_tokens(ids)
        assert [p for p in pieces if p.strip("Ġ").isdigit()] == list(str(n)), pieces
        assert tok.decode(ids) == f'"content": "{n}"'
    merged = AutoTokenizer.from_pretrained(init_tiny(tmp_path / "m", TinySpec(num_hidden_layers=1)))
    assert any(len(merged.encode(str(n))) < len(str(n)) for n in range(100, 1000))
