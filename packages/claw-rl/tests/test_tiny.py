"""The tiny model maker: offline loading, the chat template, determinism."""

import hashlib
import json
from pathlib import Path

import pytest
import torch
from claw_rl import ClawError, TinySpec, init_tiny, prompt_corpus, prompt_spec
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


#: real harness requests (claw-proxy's test fixtures, recorded from the harnesses)
REQUESTS = Path(__file__).parents[2] / "claw-proxy" / "tests" / "fixtures" / "harness-requests"


def _request_text(name: str) -> str:
    body = json.loads((REQUESTS / name).read_text())
    return json.dumps(body.get("body", body))


def test_prompt_corpus_cuts_at_added_tokens_and_keeps_the_text(tiny):
    """Decoded prompts are split at the chat markers and tool tags (a tokenizer splits those
    off before BPE runs), and the pieces hold all the rest of the text (blank pieces aside)."""
    tok = AutoTokenizer.from_pretrained(tiny)
    msgs = [{"role": "system", "content": "You are 7 tools."}, {"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(msgs, tools=TOOLS, tokenize=False)
    pieces = prompt_corpus([tok.encode(text)], tok)
    assert not any(m in p for p in pieces for m in ("<|im_start|>", "<|im_end|>", "<tool_call>"))
    rest = text
    for marker in tok.get_added_vocab():
        rest = rest.replace(marker, "")
    assert "".join("".join(pieces).split()) == "".join(rest.split())  # blank pieces dropped
    assert prompt_corpus([], tok) == []


def test_harness_prompts_in_the_corpus_shrink_them_and_round_trip(tmp_path, tiny):
    """A tokenizer that learnt one Claude Code request (recorded 3 times, as the 3 calls of a
    session are; merges across spaces, 32K vocabulary, digits split) encodes another, unseen request of the same harness in over 5x fewer tokens
    than the stock one, decodes it exactly, keeps one token per digit and file names whole."""
    stock = AutoTokenizer.from_pretrained(tiny)
    seen, unseen = _request_text("claude-code-1.json"), _request_text("claude-code-2.json")
    spec = prompt_spec(
        [stock.encode(seen)] * 3, stock, TinySpec(num_hidden_layers=1, split_digits=True)
    )
    assert (spec.vocab_size, spec.cross_word_merges, spec.split_digits) == (32768, True, True)
    tok = AutoTokenizer.from_pretrained(init_tiny(tmp_path / "h", spec))
    ids = tok.encode(unseen)
    assert len(stock.encode(unseen)) > 5 * len(ids), (len(stock.encode(unseen)), len(ids))
    assert tok.decode(ids) == unseen
    pieces = tok.convert_ids_to_tokens(tok.encode('"content": "2026"'))
    assert [p for p in pieces if any(c.isdigit() for c in p)] == list("2026"), pieces
    # a file name is the same tokens in an instruction, a tool call and a tool result
    name = tok.encode("config.txt")
    for text in ("Copy the number in config.txt into out.txt.", '{"path": "config.txt"}'):
        ids = tok.encode(text)
        assert any(ids[i : i + len(name)] == name for i in range(len(ids))), text
    # the stock spec is unchanged: the default demo's tokenizer does not move
    assert TinySpec().corpus == () and not TinySpec().cross_word_merges


def test_cli_init_tiny_takes_a_corpus(tmp_path, tiny):
    """`claw-rl init-tiny --corpus FILE --vocab-size N --cross-word-merges` learns FILE."""
    from claw_rl.cli import main
    from click.testing import CliRunner

    text = _request_text("openclaw-chat-1.json")
    (tmp_path / "prompt.txt").write_text(text)
    args = [
        "init-tiny",
        str(tmp_path / "m"),
        "--layers",
        "1",
        "--corpus",
        str(tmp_path / "prompt.txt"),
    ]
    res = CliRunner().invoke(main, [*args, "--vocab-size", "16384", "--cross-word-merges"])
    assert res.exit_code == 0, res.output
    tok = AutoTokenizer.from_pretrained(tmp_path / "m")
    stock = AutoTokenizer.from_pretrained(tiny)
    assert len(tok) > 10000 and 3 * len(tok.encode(text)) < len(stock.encode(text))
    res = CliRunner().invoke(main, ["init-tiny", str(tmp_path / "x"), "--corpus", "nope.txt"])
    assert res.exit_code == 2 and "nope.txt" in res.output


#: the committed dense fixture (claw-rl init-tiny tests/fixtures/tiny-qwen3, seed 0)
DENSE_FIXTURE = Path(__file__).parents[3] / "tests" / "fixtures" / "tiny-qwen3"


def _tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118


def test_dense_default_is_unchanged(tiny):
    """TinySpec() still writes the dense Qwen3: the committed fixture's config keys, tensor names
    and shapes, and no MoE field."""
    assert TinySpec().num_experts == 0
    config = json.loads((tiny / "config.json").read_text())
    assert config.keys() == json.loads((DENSE_FIXTURE / "config.json").read_text()).keys()
    assert config["model_type"] == "qwen3" and "num_experts" not in config
    assert _tensor_shapes(tiny) == _tensor_shapes(DENSE_FIXTURE)


def test_moe_loads_and_routes_tokens_to_many_experts(tmp_path, monkeypatch):
    """num_experts > 0 writes a Qwen3MoeForCausalLM (every layer MoE, no aux loss, tied
    embeddings, the dense model's eos/pad) whose random router spreads a short prompt over at
    least 4 of the 8 experts in every layer."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = init_tiny(tmp_path / "moe", TinySpec(num_experts=8))
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    config = model.config
    assert type(model).__name__ == "Qwen3MoeForCausalLM" and config.model_type == "qwen3_moe"
    assert (config.num_experts, config.num_experts_per_tok, config.norm_topk_prob) == (8, 2, True)
    assert config.router_aux_loss_coef == 0 and not config.output_router_logits
    assert config.tie_word_embeddings and config.eos_token_id == tok.eos_token_id
    assert config.pad_token_id == tok.pad_token_id
    routed = []
    for layer in model.model.layers:
        assert type(layer.mlp).__name__ == "Qwen3MoeSparseMoeBlock"
        layer.mlp.gate.register_forward_hook(lambda _m, _a, out: routed.append(out[2]))
    ids = torch.tensor([tok.encode("Please list the files in the workspace and count the lines.")])
    with torch.no_grad():
        model(ids)
    assert len(routed) == config.num_hidden_layers
    assert all(len(r.unique()) >= 4 for r in routed), [r.unique().tolist() for r in routed]


def test_cli_init_tiny_moe_flags(tmp_path):
    """`--experts E --experts-per-token K` (implying --moe) sets the MoE shape; a K above E is
    refused with the field named."""
    from claw_rl.cli import main
    from click.testing import CliRunner

    args = ["init-tiny", str(tmp_path / "m"), "--layers", "1", "--experts", "4"]
    res = CliRunner().invoke(main, [*args, "--experts-per-token", "1"])
    assert res.exit_code == 0, res.output
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert (config["num_local_experts"], config["num_experts_per_tok"]) == (4, 1)
    res = CliRunner().invoke(
        main, ["init-tiny", str(tmp_path / "x"), "--moe", "--experts-per-token", "9"]
    )
    assert res.exit_code == 1 and "num_experts_per_tok" in res.output
