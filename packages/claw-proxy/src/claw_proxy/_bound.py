"""A lower bound on a request's prompt tokens from its message text alone, so a prompt that is
surely over `--max-prompt-tokens` is refused before it is rendered and tokenised.

The rule (sound: it only refuses a prompt whose tokens are provably over the limit):

- The tokenizer is byte-level BPE (a `BPE` model with a `ByteLevel` pre-tokenizer, alone or in
  a `Sequence`): every byte of the (normalised) text is covered by exactly one token, and a
  token covers at most `L` bytes, `L` the longest entry of the vocabulary (in byte-level
  characters, one per byte) or of the added tokens (in UTF-8 bytes). So a text of `B` bytes
  has at least ``ceil(B / L)`` tokens.
- A normaliser can shrink the text before that: none is factor 1, NFC 3 (Hangul jamo L+V+T,
  nine bytes, compose to one three-byte syllable), NFD 2, NFKC / NFKD 4 (a four-byte
  mathematical letter becomes one ASCII byte), Lowercase 3 (the three-byte Kelvin sign becomes
  `k`), a Sequence the product. Any other normaliser (one that can drop text: Strip,
  Replace, BERT's) or any other model: no bound, every prompt is rendered.
- The texts counted are the contents of the roles the chat template writes verbatim, found
  once per template by rendering a probe conversation whose contents carry surrounding
  whitespace (a template that trims or drops a role's content does not get that role
  counted). Characters are counted, not bytes (a character is at least one byte), so the
  count costs nothing.

Bound: ``tokens >= ceil(characters / (L * shrink))``. For the tiny test tokenizer L is 26; for
vocabularies with long tokens (runs of spaces or dashes) the bound is weak and only
`--max-body-bytes` caps the work.
"""

from __future__ import annotations

import json
import logging

from claw_proxy.errors import RequestError
from claw_proxy.messages import ChatRequest

log = logging.getLogger("claw_proxy")

# how much a normaliser can shrink UTF-8 text, at most (see the module docstring)
_SHRINK = {"NFC": 3, "NFD": 2, "NFKC": 4, "NFKD": 4, "Lowercase": 3}


def _shrink(normalizer: dict | None) -> int | None:
    if normalizer is None:
        return 1
    kind = normalizer.get("type")
    if kind == "Sequence":
        total = 1
        for inner in normalizer.get("normalizers") or []:
            factor = _shrink(inner)
            if factor is None:
                return None
            total *= factor
        return total
    return _SHRINK.get(kind) if isinstance(kind, str) else None


def _byte_level(pre: dict | None) -> bool:
    if pre is None:
        return False
    if pre.get("type") == "Sequence":
        return any(_byte_level(p) for p in pre.get("pretokenizers") or [])
    return pre.get("type") == "ByteLevel"


def bytes_per_token(tokenizer) -> int | None:
    """`L * shrink` for a byte-level BPE tokenizer (see the module docstring); None when no
    sound bound exists for this tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    spec = json.loads(backend.to_str())
    model = spec.get("model") or {}
    shrink = _shrink(spec.get("normalizer"))
    if model.get("type") != "BPE" or not _byte_level(spec.get("pre_tokenizer")) or shrink is None:
        return None
    longest = max((len(k) for k in backend.get_vocab(with_added_tokens=False)), default=0)
    for added in backend.get_added_tokens_decoder().values():
        longest = max(longest, len(added.content.encode("utf-8")))
    return max(1, longest) * shrink


def verbatim_roles(renderer) -> frozenset[str]:
    """The roles whose content the chat template writes unchanged (whitespace included):
    ``system`` (counted for a first system message only), ``user`` (every user message of the
    probe), ``tool``."""
    mark = {r: f"\n  claw-probe-{r} \n" for r in ("system", "user", "user2", "tool")}
    call = {"id": "call_probe", "type": "function", "function": {"name": "probe", "arguments": {}}}
    tries: tuple[list[dict], ...] = (
        [
            {"role": "system", "content": mark["system"]},
            {"role": "user", "content": mark["user"]},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": mark["tool"], "tool_call_id": "call_probe"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": mark["user2"]},
        ],
        [
            {"role": "system", "content": mark["system"]},
            {"role": "user", "content": mark["user"]},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": mark["user2"]},
        ],
    )
    for msgs in tries:
        try:
            text = renderer._template(msgs, None, True)
        except RequestError:
            continue
        found = {r for r, m in mark.items() if any(x["content"] == m for x in msgs) and m in text}
        roles = {"system", "tool"} & found
        if {"user", "user2"} <= found:
            roles.add("user")
        return frozenset(roles)
    return frozenset()


class PromptBound:
    """The lower bound for one tokenizer and chat template (computed once, at start)."""

    def __init__(self, renderer) -> None:
        self.bytes_per_token = bytes_per_token(renderer.tokenizer)
        self.roles = verbatim_roles(renderer) if self.bytes_per_token else frozenset()
        log.info(
            "prompt bound for %s: %s",
            renderer.directory,
            f"a token covers at most {self.bytes_per_token} characters of "
            f"{', '.join(sorted(self.roles))} text"
            if self.roles
            else "none (every prompt is rendered before --max-prompt-tokens is checked)",
        )

    def at_least(self, req: ChatRequest) -> tuple[int, int]:
        """(tokens the rendered prompt has at least, characters counted)."""
        if not self.roles or not self.bytes_per_token:
            return 0, 0
        roles, msgs = self.roles, req.messages
        chars = sum(
            len(m.content)
            for i, m in enumerate(msgs)
            if m.role in roles and (m.role != "system" or i == 0)
        )
        return -(-chars // self.bytes_per_token), chars


__all__ = ["PromptBound", "bytes_per_token", "verbatim_roles"]
