"""A tiny random-weight Qwen3 causal LM with a locally trained byte-level BPE tokenizer.

Tests and the CPU demo need a model that loads with ``AutoModelForCausalLM`` /
``AutoTokenizer`` offline, speaks a Qwen-style chat template with tools, and is small enough
to train on two CPU cores. Nothing here touches a model hub: the tokenizer is trained
in-process on a deterministic corpus, the weights come from a seeded initialisation.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable
from importlib.resources import files
from pathlib import Path

import attrs

from claw_rl.errors import ClawError

# Added tokens: ChatML turn markers are special (the engine stops at <|im_end|>); the tool
# and reasoning markers are ordinary added tokens so that decoding keeps them, as in Qwen3.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MARKUP_TOKENS = [
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]

_WORDS = (  # noqa: SIM905 - a word list reads best as prose
    "the a an and or of to in on for with from by as is are was be this that it file files "
    "read write create list move rename copy delete line lines text json csv yaml config report "
    "data value values key keys name names id date total count sum mean sort by order column row "
    "rows output input workspace task done ok error fix test tests pass fail run command shell "
    "bash python script function return true false null none user assistant system tool tools "
    "call result answer question please can you the file contains should must will each all "
    "first last next new old hello world yes no number string object array type properties "
    "required description path content arguments exec cat ls echo grep sed mkdir cd import def "
    "class print if else for while in not with open self"
).split()

_SNIPPETS = [
    '{"type": "function", "function": {"name": "bash", "description": "Run a shell command", '
    '"parameters": {"type": "object", "properties": {"command": {"type": "string"}}, '
    '"required": ["command"]}}}',
    '<tool_call>\n{"name": "write_file", "arguments": {"path": "answer.txt", "content": "hello"}}\n</tool_call>',
    "<tool_response>\nok\n</tool_response>",
    "def main():\n    with open('data.csv') as f:\n        rows = [line.split(',') for line in f]\n    print(len(rows))\n",
    "name,date,total\nalice,2026-01-02,12\nbob,2026-01-03,7\n",
    "You are a helpful assistant. Use the tools to complete the task in the workspace.",
]


#: a file name with its extension (report.txt, CLAUDE.md): one pre-token with cross-word merges
FILE_NAME = r"[A-Za-z0-9_\-]+\.[A-Za-z0-9]+"


def _texts(texts: Iterable[str]) -> tuple[str, ...]:
    return tuple(texts)


@attrs.frozen(kw_only=True)
class TinySpec:
    """Shape of the tiny model. head_dim >= 32 keeps vLLM's CPU attention backend happy."""

    vocab_size: int = 4096
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    max_position_embeddings: int = 65536
    seed: int = 0
    # Each digit its own token, as Qwen's pre-tokenizer does: every number then has one
    # consistent tokenization, and a tiny model learns to copy numbers it has never seen (with
    # BPE merges, 352 of the numbers 100-999 are two tokens, split in varying places, and a copy
    # learnt on some numbers does not carry over). Off by default: toy-digits' dense reward is
    # tuned on the merged tokens.
    split_digits: bool = False
    # Extra tokenizer corpus: texts the BPE also learns from, e.g. the prompts a real harness
    # sends (`prompt_corpus`). Their long fixed parts (system prompt, tool schemas) are worth
    # many merges only when merges may cross spaces: `cross_word_merges` (no pre-split into
    # words) with a larger `vocab_size`. Claude Code's 50K-character request is 25.8K tokens
    # with the default tokenizer, 11.6K split into words, and 1.1K with a 32K cross-word
    # vocabulary trained on two of its requests (1.2K on a third it never saw).
    # With cross-word merges a file name is still split off on its own (FILE_NAME), so it is
    # the same tokens in an instruction ("in config.txt into"), a tool call and a tool result:
    # merged with its neighbours, a tiny model learnt the tool-call format but could not copy
    # the names (toy-steps held-out Pass@1 0 after SFT through all three harnesses).
    corpus: tuple[str, ...] = attrs.field(default=(), converter=_texts)
    cross_word_merges: bool = False
    # Mixture of experts: num_experts > 0 makes every layer a Qwen3-MoE sparse block (a
    # `Qwen3MoeForCausalLM`) that routes each token to its num_experts_per_tok largest router
    # weights, renormalised over them when norm_topk_prob. 0 is the dense Qwen3 model.
    num_experts: int = 0
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 64
    norm_topk_prob: bool = True

    def __attrs_post_init__(self) -> None:
        if self.num_experts < 0:
            raise ClawError(f"TinySpec.num_experts: {self.num_experts} < 0")
        if self.num_experts and not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ClawError(
                f"TinySpec.num_experts_per_tok: {self.num_experts_per_tok} is not in "
                f"[1, num_experts={self.num_experts}]"
            )


def chat_template() -> str:
    """The Jinja chat template shipped with the tiny model (Qwen3-style, tools included)."""
    return files("claw_rl").joinpath("_chat_template.jinja").read_text()


def _corpus(seed: int) -> list[str]:
    rng = random.Random(seed)
    printable = [chr(c) for c in range(32, 127)]
    lines = ["".join(printable), *_SNIPPETS, chat_template()]
    for _ in range(6000):
        words = rng.choices(_WORDS, k=rng.randint(3, 14))
        line = " ".join(words)
        if rng.random() < 0.3:
            line = json.dumps({rng.choice(_WORDS): line, "n": rng.randint(0, 999)})
        lines.append(line.capitalize() + rng.choice([".", "?", "\n", ":", ""]))
    return lines


def prompt_spec(prompts: list[list[int]], tokenizer, spec: TinySpec | None = None) -> TinySpec:
    """The spec of a tiny policy for real harnesses: `spec` (default: one token per digit) with
    the recorded `prompts` (in `tokenizer`) in its tokenizer's corpus, merges across spaces, a
    32K vocabulary. Claude Code's prompt is then about 530 tokens instead of 25K (digits still
    split it: each is a token), OpenClaw's about 260 instead of 19K."""
    spec = spec or TinySpec(split_digits=True)
    corpus = prompt_corpus(prompts, tokenizer)
    return attrs.evolve(spec, corpus=corpus, vocab_size=32768, cross_word_merges=True)


def prompt_corpus(prompts: list[list[int]], tokenizer) -> list[str]:
    """Tokenizer corpus from recorded prompts (a claw.call's `prompt_ids`) in `tokenizer`: each
    prompt decoded, cut at the added tokens (the chat markers, tool-call tags), which a tokenizer
    splits off before its BPE runs, so no merge would ever span them."""
    added = sorted(tokenizer.get_added_vocab(), key=len, reverse=True)
    pattern = re.compile("|".join(re.escape(t) for t in added)) if added else None
    out: list[str] = []
    for ids in prompts:
        text = tokenizer.decode(ids, skip_special_tokens=False)
        out += [p for p in (pattern.split(text) if pattern else [text]) if p.strip()]
    return out


def build_tokenizer(spec: TinySpec):
    """Train a byte-level BPE tokenizer in-process and wrap it as a transformers fast tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    pre = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=not spec.cross_word_merges)]
    if spec.split_digits:
        pre.insert(0, pre_tokenizers.Digits(individual_digits=True))
    if spec.cross_word_merges:  # a file name is its own piece: the same tokens wherever it is
        pre.insert(0, pre_tokenizers.Split(Regex(FILE_NAME), behavior="isolated"))
    tok.pre_tokenizer = pre[0] if len(pre) == 1 else pre_tokenizers.Sequence(pre)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([*_corpus(spec.seed), *spec.corpus], trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=["<|im_start|>"],
        clean_up_tokenization_spaces=False,
        model_max_length=spec.max_position_embeddings,
    )
    fast.add_tokens(MARKUP_TOKENS)
    fast.chat_template = chat_template()
    return fast


def init_tiny(out_dir: str | Path, spec: TinySpec | None = None) -> Path:
    """Write a random-weight Qwen3 model (Qwen3-MoE when ``spec.num_experts``) and its
    tokenizer to ``out_dir``; return the path."""
    spec = spec or TinySpec()
    import torch
    from transformers import GenerationConfig

    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise ClawError(f"{out}: directory exists and is not empty; choose a new directory")
    tokenizer = build_tokenizer(spec)
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(spec.seed)
    model = _moe_model(spec, common) if spec.num_experts else _dense_model(common)
    model.generation_config = GenerationConfig(
        eos_token_id=model.config.eos_token_id,
        pad_token_id=model.config.pad_token_id,
        do_sample=True,
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def _dense_model(common: dict):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return Qwen3ForCausalLM(Qwen3Config(**common))


def _moe_model(spec: TinySpec, common: dict):
    """Every layer a sparse MoE block; no aux loss in the config (the learner adds its own)."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        **common,
        num_experts=spec.num_experts,
        num_experts_per_tok=spec.num_experts_per_tok,
        moe_intermediate_size=spec.moe_intermediate_size,
        norm_topk_prob=spec.norm_topk_prob,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        router_aux_loss_coef=0.0,
        output_router_logits=False,
    )
    model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():  # a zero router sends every token to the same experts
        for layer in model.model.layers:
            weight = layer.mlp.gate.weight
            if not weight.abs().sum():
                weight.normal_(0.0, config.initializer_range)
    return model
