"""Completion tokens as OpenAI logprob entries: `{token, logprob, bytes, top_logprobs}`."""

from __future__ import annotations

import math
from functools import cache

from claw_proxy.errors import RequestError
from claw_proxy.messages import optional

# OpenAI reports a logprob too small to represent as this value
_FLOOR = -9999.0


@cache
def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's bytes_to_unicode: byte-level BPE pieces back to raw bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def check_top_logprobs(body: dict) -> None:
    """`top_logprobs` may be 0 (or absent): the engines report the sampled token's logprob only."""
    top = optional(body, "top_logprobs", int)
    if top is not None and not 0 <= top <= 20:
        raise RequestError("top_logprobs must be between 0 and 20", "top_logprobs")
    if top:
        raise RequestError(
            "top_logprobs is not supported beyond 0: the inference engines report the logprob of "
            "the sampled token only (ask for the logprobs without top_logprobs)",
            "top_logprobs",
        )


class TokenText:
    """A token id's exact bytes and its text, from the tokenizer that sampled it.

    A byte-level BPE piece maps back to its raw bytes, so a token that holds only part of a
    UTF-8 character still reports its bytes (its `token` text then has U+FFFD); other
    tokenizers report the UTF-8 of the token decoded alone."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        decoder = getattr(backend, "decoder", None)
        self.byte_level = type(decoder).__name__ == "ByteLevel"
        # added tokens (special tokens, <think>, ...) are stored as plain text, not byte-level
        self.added = set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def _decode_alone(self, token_id: int) -> bytes:
        return self.tokenizer.decode([token_id], skip_special_tokens=False).encode("utf-8")

    def text_and_bytes(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is None:
            raw = None
            if self.byte_level and token_id not in self.added:
                piece = self.tokenizer.convert_ids_to_tokens(token_id)
                table = _byte_decoder()
                if isinstance(piece, str) and piece and all(c in table for c in piece):
                    raw = bytes(table[c] for c in piece)
            if raw is None:
                raw = self._decode_alone(token_id)
            hit = self._cache[token_id] = (raw.decode("utf-8", "replace"), list(raw))
        return hit

    def entry(self, token_id: int, logprob: float) -> dict:
        text, raw = self.text_and_bytes(token_id)
        lp = float(logprob) if math.isfinite(logprob) else _FLOOR
        return {"token": text, "logprob": max(lp, _FLOOR), "bytes": raw, "top_logprobs": []}


__all__ = ["TokenText", "check_top_logprobs"]
