"""Shared helpers for the claw-proxy tests: the tiny model of the repository, a secret, tokens,
scripted replies and reference logprobs."""

from __future__ import annotations

import json
from pathlib import Path

from claw_proxy import mint_token

ROOT = Path(__file__).resolve().parents[3]


TINY = ROOT / "tests" / "fixtures" / "tiny-qwen3"


HARNESS_REQUESTS = Path(__file__).parent / "fixtures" / "harness-requests"


SECRET = "test-secret"


ADMIN = "admin-token"


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


def tool_call_text(name: str, arguments: dict) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def write_script(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def token(session: str = "s1", **tags) -> str:
    return mint_token(session, SECRET, tags or None)


def reference_logprobs(model, call) -> list[float]:
    """What a call's completion_logprobs must be, from an independent forward pass over its
    prompt + completion under its recorded `sampling`: 0.0 for greedy tokens (which must be the
    argmax); otherwise log_softmax(logits / T) over the kept set, renormalised. The kept set is
    computed here as vLLM does: top_k by the k-th largest value, then top_p by sorting ascending
    and dropping the tokens whose ascending cumulative probability is <= 1 - top_p."""
    import torch

    ids = torch.tensor([call.prompt_ids + call.completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double()
    s = call.sampling
    t, top_p, top_k = s.get("temperature", 1.0), s.get("top_p", 1.0), s.get("top_k", 0)
    n = len(call.prompt_ids)
    out = []
    for i, tok in enumerate(call.completion_ids):
        row = logits[n - 1 + i]
        if t == 0:
            assert tok == int(row.argmax())
            out.append(0.0)
            continue
        row = row / t
        if 0 < top_k < row.numel():
            row = torch.where(row < row.sort(descending=True).values[top_k - 1], -torch.inf, row)
        if top_p < 1:
            asc, idx = row.sort()
            cum = torch.softmax(asc, -1).cumsum(-1)
            drop = cum <= 1 - top_p
            drop[-1] = False
            row = row.clone()
            row[idx[drop]] = -torch.inf
        out.append(float(torch.log_softmax(row, -1)[tok]))
    return out


def _bpe_corpus() -> list[str]:
    """A small, fixed training text: prose, code, numbers, non-ASCII and long runs of dashes
    and spaces (so the vocabulary gets tokens hundreds of bytes long, as real ones have)."""
    import random

    rnd = random.Random(7)
    words = [
        "the",
        "of",
        "and",
        "to",
        "in",
        "is",
        "that",
        "for",
        "it",
        "with",
        "as",
        "was",
        "on",
        "be",
        "by",
        "this",
        "are",
        "from",
        "at",
        "or",
        "an",
        "not",
        "def",
        "return",
        "import",
        "class",
        "self",
        "value",
        "list",
        "dict",
        "print",
        "if",
        "else",
        "for",
        "while",
        "yield",
        "None",
        "proxy",
        "token",
        "prompt",
        "limit",
        "render",
        "session",
        "tool",
        "call",
        "answer",
        "model",
        "über",
        "café",
        "naïve",
        "日本語",
        "テキスト",
        "한국어",
        "Привет",
        "мир",
    ]
    lines = []
    for i in range(3000):
        n = rnd.randint(3, 14)
        line = " ".join(rnd.choice(words) for _ in range(n))
        if i % 7 == 0:
            line = "    " * rnd.randint(1, 4) + line + f" = {rnd.randint(0, 99999)}"
        lines.append(line)
    lines += ["-" * 512, "=" * 256, " " * 300 + "x", "#" * 128] * 40
    return lines


def bpe_dir(path: Path, *, normalizer: str | None = None) -> Path:
    """An HF directory like the tiny model's (chat template, special tokens, eos), but with a
    byte-level BPE vocabulary of 4,000 entries trained here on `_bpe_corpus` (its longest token
    is 512 bytes). `normalizer="NFC"` gives a Qwen2-style tokenizer: NFC, then a Split on a
    regex, then ByteLevel without its own regex."""
    import shutil

    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    path.mkdir(parents=True, exist_ok=True)
    for f in TINY.iterdir():
        if f.name not in ("model.safetensors", "tokenizer.json"):
            shutil.copy(f, path / f.name)
    spec = json.loads((TINY / "tokenizer.json").read_text())
    specials = [a["content"] for a in spec["added_tokens"]]
    tok = Tokenizer(models.BPE())
    if normalizer == "NFC":
        tok.normalizer = normalizers.NFC()
        split = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=4000,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_bpe_corpus(), trainer)
    trained = json.loads(tok.to_str())
    for added, old in zip(trained["added_tokens"], spec["added_tokens"], strict=True):
        added.update({k: old[k] for k in ("special", "normalized", "lstrip", "rstrip")})
    (path / "tokenizer.json").write_text(json.dumps(trained))
    return path
