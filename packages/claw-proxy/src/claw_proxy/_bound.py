"""A lower bound on a request's prompt tokens from its message text alone, so a prompt that is
surely over `--max-prompt-tokens` is refused before it is rendered and tokenised, after work
that grows with the limit, not with the prompt.

Two rules, both sound (they only refuse a prompt whose tokens are provably over the limit), for
a byte-level BPE tokenizer (a `BPE` model whose pre-tokenizers are `ByteLevel` without a prefix
space, alone or in a `Sequence` with `Split`, `Digits` or `Punctuation` that drop nothing, no
added token that strips the whitespace around it, no truncation). Its tokens then cover the
(normalised) text: every byte is in exactly one token, and a token is a vocabulary entry (in
byte-level characters, one per byte) or an added token.

The texts counted are the contents of the roles the chat template writes verbatim, found once
per template by rendering a probe conversation whose contents carry surrounding whitespace (a
template that trims or drops a role's content does not get that role counted).

1. Characters (free): a token covers at most `L` bytes, `L` the longest vocabulary entry or
   added token, and a normaliser shrinks text by at most a factor `s` (none 1, NFC 3: Hangul
   jamo L+V+T, nine bytes, compose to one three-byte syllable; NFD 2; NFKC / NFKD 4: a
   four-byte mathematical letter becomes one ASCII byte; Lowercase 3: the Kelvin sign becomes
   `k`; a Sequence the product). So ``tokens >= ceil(characters / (L * s))``. Weak where the
   vocabulary has long tokens (runs of spaces or dashes).
2. Fewest pieces (`TokenFloor`), when rule 1 does not decide: the texts are cut into chunks of
   at most 8K characters and each chunk is covered with the fewest vocabulary pieces (a
   Viterbi pass over the vocabulary, in the tokenizers library, counting pieces), chunk after
   chunk until the count passes the limit. Why it is a lower bound, for one chunk `R` (a
   substring of the prompt text, normalised): the prompt's tokens that meet `R` cut it into
   `q1, t2 .. t(k-1), qk`, where the middle ones are whole tokens, `q1` a suffix of a token and
   `qk` a prefix of one (or `R` lies inside one token, k = 1). So the fewest pieces for `R`,
   `m(R)`, is at most ``k - 2 + S + P`` (or `U` when k = 1), with `S`, `P` and `U` the most
   pieces any suffix, prefix or substring of a token needs. These come from the BPE merges: a
   token made by merging `a` and `b` has ``P(ab) <= max(P(a), 1 + P(b))``,
   ``S(ab) <= max(S(b), 1 + S(a))``, ``U(ab) <= max(U(a), U(b), S(a) + P(b))``, a single byte
   1; a token no merge makes (an added one) is measured directly (its length when over 32). With ``slack = max(S + P - 2, U - 1) + 1``
   (the last 1: a token that starts before `R` is counted with the chunk before), the tokens
   that start inside `R` number at least ``m(R) - slack``, and chunks do not overlap, so the
   prompt has at least the sum over chunks of ``max(0, m(R) - slack)`` tokens.
   With a normaliser (NFC, NFD, NFKC, NFKD, Lowercase or a Sequence of them) the chunk is
   normalised by the same normaliser, and chunks begin and end only before a character where
   normalisation cannot reach across (ASCII, CJK ideographs, Hangul syllables: no character
   before them composes or reorders with them), so the chunk's normal form is a substring of
   the prompt's; a message's text before its first and after its last such character is not
   counted. Added tokens are pieces too (as written and normalised), and only tokenizers whose
   added tokens begin and end with ASCII get this rule (an added token is matched before
   normalisation, so the text on its sides is normalised apart).
   A message counted once is remembered (by its text's hash and length), so a conversation
   that grows by a few messages a turn pays for the new ones only.

3. Messages (free), when the template puts an added token between any two counted texts (found
   once per template from a probe conversation with consecutive user and tool messages, see
   `separated`): the tokenizer splits added tokens out before anything else, so no token
   crosses one, and the stretches of the prompt between them are tokenised apart. Each
   non-empty counted text lies in a stretch of its own, which has at least one token. So
   ``tokens >= the number of non-empty counted texts``: a prompt of many messages too short
   for rule 2's slack is refused after counting its messages, whatever its size.

Other tokenizers, or normalisers that can drop text (Strip, Replace, BERT's): no bound, every
prompt is rendered and only `--max-body-bytes` caps the work.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator

from claw_proxy.errors import RequestError
from claw_proxy.messages import ChatRequest

log = logging.getLogger("claw_proxy")

# how much a normaliser can shrink UTF-8 text, at most (see the module docstring)
_SHRINK = {"NFC": 3, "NFD": 2, "NFKC": 4, "NFKD": 4, "Lowercase": 3}
# pre-tokenizers that keep every character of the text (a `Split` or `Punctuation` that
# removes its matches does not)
_KEEPING = {"ByteLevel", "Split", "Digits", "Punctuation"}

CHUNK = 8192  # characters per chunk of the fewest-pieces count
_BATCH = 65536  # characters per call of the counting tokenizer, at most
_MEMO_ENTRIES = 4096
_MEMO_MIN = 2048  # messages shorter than this are counted again (cheaper than remembered)
# characters before which no normaliser reaches back: ASCII, CJK ideographs, Hangul syllables
_STABLE = re.compile("[\x00-\x7f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7a3]")


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
    """Whether the pre-tokenizer maps text to bytes and keeps all of it (see the docstring)."""
    if pre is None:
        return False
    members = pre.get("pretokenizers") or [] if pre.get("type") == "Sequence" else [pre]
    kinds = [p.get("type") for p in members]
    return (
        "ByteLevel" in kinds
        and all(k in _KEEPING for k in kinds)
        and all(p.get("behavior") != "Removed" for p in members)
        and not any(p.get("add_prefix_space") for p in members if p.get("type") == "ByteLevel")
    )


def _covering(spec: dict) -> bool:
    """Whether the tokenizer's tokens cover its normalised text as the docstring says."""
    model = spec.get("model") or {}
    return (
        model.get("type") == "BPE"
        and not model.get("continuing_subword_prefix")
        and not model.get("end_of_word_suffix")
        and _byte_level(spec.get("pre_tokenizer"))
        and spec.get("truncation") is None
        and not any(a.get("lstrip") or a.get("rstrip") for a in spec.get("added_tokens") or [])
    )


def bytes_per_token(tokenizer) -> int | None:
    """`L * shrink` for a byte-level BPE tokenizer (see the module docstring); None when no
    sound bound exists for this tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    spec = json.loads(backend.to_str())
    shrink = _shrink(spec.get("normalizer"))
    if not _covering(spec) or shrink is None:
        return None
    longest = max((len(k) for k in backend.get_vocab(with_added_tokens=False)), default=0)
    for added in backend.get_added_tokens_decoder().values():
        longest = max(longest, len(added.content.encode("utf-8")))
    return max(1, longest) * shrink


def _byte_chars() -> dict[int, str]:
    """GPT-2's map of bytes to printable characters (the byte-level alphabet)."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    out, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + extra)
            extra += 1
    return out


_BYTES = _byte_chars()


def _as_bytes(text: str) -> str:
    return "".join(_BYTES[b] for b in text.encode("utf-8", "surrogatepass"))


def _fewest(text: str, pieces, longest: int) -> list[int]:
    """fewest[i]: the fewest `pieces` that cover text[:i] (a plain dynamic programme)."""
    n = len(text)
    fewest = [0] + [n + 1] * n
    for i in range(1, n + 1):
        for j in range(max(0, i - longest), i):
            if fewest[j] + 1 < fewest[i] and text[j:i] in pieces:
                fewest[i] = fewest[j] + 1
    return fewest


def _ends(v: str, pieces, longest: int) -> tuple[int, int, int]:
    """(P, S, U) of the module docstring for a piece that no merge makes, exactly when it is
    short, else its length (a piece of one character covers each character)."""
    if len(v) > 32:
        return len(v), len(v), len(v)
    subs = [_fewest(v[a:], pieces, longest) for a in range(len(v))]
    return (
        max(subs[0][1:]),
        max(f[-1] for f in subs),
        max(max(f[1:]) for f in subs),
    )


def edge_slack(vocab, merges, extra) -> int:
    """`slack` of the module docstring: from the BPE merges, for the vocabulary `vocab` and the
    other pieces `extra` (added tokens); a piece no merge makes is measured directly."""
    parts: dict[str, tuple[str, str]] = {}
    for m in merges:
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        parts.setdefault(a + b, (a, b))
    every = set(vocab) | set(extra)
    longest = max(map(len, every), default=1)
    pre: dict[str, int] = {}
    suf: dict[str, int] = {}
    sub: dict[str, int] = {}
    for v in sorted(every, key=len):
        ab = parts.get(v)
        if len(v) <= 1:
            pre[v] = suf[v] = sub[v] = 1
        elif ab is not None and ab[0] in pre and ab[1] in pre:
            a, b = ab
            pre[v] = max(pre[a], 1 + pre[b])
            suf[v] = max(suf[b], 1 + suf[a])
            sub[v] = max(sub[a], sub[b], suf[a] + pre[b])
        else:
            pre[v], suf[v], sub[v] = _ends(v, every, longest)
    p, s, u = (
        max(pre.values(), default=1),
        max(suf.values(), default=1),
        max(sub.values(), default=1),
    )
    return max(s + p - 2, u - 1) + 1


class TokenFloor:
    """Rule 2 of the module docstring for one tokenizer: `count` gives a lower bound on the
    prompt tokens that a list of message texts accounts for, stopping past a limit."""

    def __init__(self, backend, spec: dict) -> None:
        from tokenizers import Tokenizer

        added = [a["content"] for a in spec.get("added_tokens") or []]
        norm = backend.normalizer
        forms = set(added) | ({norm.normalize_str(a) for a in added} if norm else set())
        extra = {_as_bytes(a) for a in forms} | set(_BYTES.values())
        vocab = backend.get_vocab(with_added_tokens=False)
        self.slack = edge_slack(vocab, (spec.get("model") or {}).get("merges") or [], extra)
        self.normalized = spec.get("normalizer") is not None
        pieces = sorted(set(vocab) | extra)
        counter: dict = {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": [],
            "normalizer": spec.get("normalizer"),
            "pre_tokenizer": {
                "type": "ByteLevel",
                "add_prefix_space": False,
                "trim_offsets": False,
                "use_regex": False,
            },
            "post_processor": None,
            "decoder": None,
            "model": {
                "type": "Unigram",
                "unk_id": None,
                "vocab": [[p, -1.0] for p in pieces],
                "byte_fallback": False,
            },
        }
        self._counter = Tokenizer.from_str(json.dumps(counter))
        self._memo: OrderedDict[tuple[int, int], int] = OrderedDict()
        self._lock = threading.Lock()
        self.counted_chars = 0  # characters given to the counting tokenizer (tests, stats)

    @staticmethod
    def supports(spec: dict) -> bool:
        if not _covering(spec) or _shrink(spec.get("normalizer")) is None:
            return False
        if spec.get("normalizer") is None:
            return True
        ascii_ends = (a["content"] for a in spec.get("added_tokens") or [])
        return all(c and c[0].isascii() and c[-1].isascii() for c in ascii_ends)

    def pieces(self, texts: list[str]) -> list[int]:
        """The fewest pieces that cover each text (normalised first): `m` of the docstring."""
        self.counted_chars += sum(map(len, texts))
        try:
            found = self._counter.encode_batch(texts, add_special_tokens=False)
        except Exception:  # text the tokenizers library refuses: nothing counted (still a bound)
            return [0] * len(texts)
        return [len(e.ids) for e in found]

    def _chunks(self, text: str) -> Iterator[str]:
        """The chunks of one message's text (see the docstring: with a normaliser, only between
        characters it cannot reach across)."""
        if not self.normalized:
            for i in range(0, len(text), CHUNK):
                yield text[i : i + CHUNK]
            return
        first = _STABLE.search(text)
        if first is None:
            return
        start, end = first.start(), len(text)
        while end > start and not _STABLE.match(text, end - 1):
            end -= 1
        end -= 1  # the region ends before the last stable character (what follows is unknown)
        while start < end:
            cut = start + CHUNK
            if cut >= end:
                yield text[start:end]
                return
            while cut > start and not _STABLE.match(text, cut):
                cut -= 1
            if cut == start:  # no stable character in this stretch: skip to the next one
                nxt = _STABLE.search(text, start + CHUNK, end)
                if nxt is None:
                    return
                cut = nxt.start()
                start = cut
                continue
            yield text[start:cut]
            start = cut

    def count(self, texts: list[str], limit: int) -> int:
        """At least how many prompt tokens `texts` (whole messages' contents, each written
        verbatim in the prompt) account for; stops once that passes `limit`, so the work grows
        with the limit, not with the texts. Chunks of several messages share a call of the
        counting tokenizer, so many small messages cost no more than one long one."""
        total = 0
        fresh: dict[tuple[int, int], int] = {}  # messages counted now: remembered at the end
        owners: list[tuple[int, int]] = []
        again: list[tuple[int, int]] = []
        batch: list[str] = []
        size = 0

        def flush() -> int:
            got = 0
            for key, m in zip(owners, self.pieces(batch), strict=True):
                n = max(0, m - self.slack)
                fresh[key] += n
                got += n
            owners.clear()
            batch.clear()
            return got

        for text in texts:
            key = (hash(text), len(text))
            with self._lock:
                known = self._memo.get(key)
                if known is not None:
                    self._memo.move_to_end(key)
            if known is not None:
                total += known
            elif key in fresh:
                again.append(key)
            else:
                fresh[key] = 0
                for chunk in self._chunks(text):
                    owners.append(key)
                    batch.append(chunk)
                    size += len(chunk)
                    # each call covers about what the room left could still need
                    if size >= min(_BATCH, max(CHUNK, 4 * (limit - total))):
                        total += flush()
                        size = 0
                        if total > limit:
                            return total  # not remembered: some messages were not counted
            if total > limit:
                return total
        if batch:
            total += flush()
        total += sum(fresh[key] for key in again)  # a text sent twice is in the prompt twice
        with self._lock:
            for key, n in fresh.items():
                if key[1] >= _MEMO_MIN:
                    self._memo[key] = n
            while len(self._memo) > _MEMO_ENTRIES:
                self._memo.popitem(last=False)
        return total


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


def separated(renderer, roles: frozenset[str], spec: dict) -> bool:
    """Whether the chat template writes an added token between every two consecutive texts of
    `roles` (rule 3 of the module docstring), on a probe with a first system message,
    consecutive user messages and consecutive tool results."""
    barriers = [
        a["content"]
        for a in spec.get("added_tokens") or []
        if a.get("content") and not a.get("single_word") and not a.get("lstrip")
        and not a.get("rstrip")
    ]  # fmt: skip
    if not roles or not barriers:
        return False
    call = {"id": "call_probe", "type": "function", "function": {"name": "probe", "arguments": {}}}
    msgs: list[dict] = [
        {"role": "system", "content": "claw-probe-0"},
        {"role": "user", "content": "claw-probe-1"},
        {"role": "user", "content": "claw-probe-2"},
        {"role": "assistant", "content": "", "tool_calls": [call, {**call, "id": "call_2"}]},
        {"role": "tool", "content": "claw-probe-3", "tool_call_id": "call_probe"},
        {"role": "tool", "content": "claw-probe-4", "tool_call_id": "call_2"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "claw-probe-5"},
    ]
    try:
        text = renderer._template(msgs, None, True)
    except RequestError:
        return False
    marks = [m["content"] for m in msgs if m["role"] in roles]
    at = [text.find(m) for m in marks]
    if any(i < 0 for i in at) or at != sorted(at) or any(text.count(m) != 1 for m in marks):
        return False
    gaps = [text[a + len(m) : b] for a, m, b in zip(at, marks, at[1:], strict=False)]
    return all(any(t in gap for t in barriers) for gap in gaps)


class PromptBound:
    """The lower bounds for one tokenizer and chat template (set up once, at start)."""

    def __init__(self, renderer) -> None:
        backend = getattr(renderer.tokenizer, "backend_tokenizer", None)
        spec = json.loads(backend.to_str()) if backend is not None else {}
        self.bytes_per_token = bytes_per_token(renderer.tokenizer)
        self.roles = verbatim_roles(renderer) if self.bytes_per_token else frozenset()
        self.floor = TokenFloor(backend, spec) if self.roles and TokenFloor.supports(spec) else None
        self.separated = separated(renderer, self.roles, spec)
        log.info(
            "prompt bound for %s: %s",
            renderer.directory,
            f"a token covers at most {self.bytes_per_token} characters of "
            f"{', '.join(sorted(self.roles))} text"
            + (f"; fewest pieces counted (slack {self.floor.slack})" if self.floor else "")
            + ("; each message's text at least one token" if self.separated else "")
            if self.roles
            else "none (every prompt is rendered before --max-prompt-tokens is checked)",
        )

    def texts(self, req: ChatRequest) -> list[str]:
        """The message texts the template writes verbatim (a system message only first)."""
        if not self.roles:
            return []
        roles = self.roles
        return [
            m.content
            for i, m in enumerate(req.messages)
            if m.role in roles and (m.role != "system" or i == 0) and m.content
        ]

    def at_least(self, req: ChatRequest) -> tuple[int, int]:
        """Rules 1 and 3: (tokens the rendered prompt has at least, characters counted)."""
        if not self.bytes_per_token:
            return 0, 0
        texts = self.texts(req)
        chars = sum(map(len, texts))
        return max(-(-chars // self.bytes_per_token), len(texts) if self.separated else 0), chars


__all__ = [
    "PromptBound",
    "TokenFloor",
    "bytes_per_token",
    "edge_slack",
    "separated",
    "verbatim_roles",
]
