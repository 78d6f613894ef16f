"""A readable text rendering of one session's tree, and a dependency-free token decoder."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from claw_tree.errors import ClawError
from claw_tree.tree import Forest

Decoder = Callable[[Sequence[int]], str]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte <-> printable-unicode table used by byte-level BPE vocabularies."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def load_decoder(directory: str | Path) -> Decoder:
    """A decode(ids) -> text function for the tokenizer in an HF model/tokenizer directory.

    Uses the `tokenizers` library when it is installed; otherwise reads ``tokenizer.json``
    itself (vocabulary + added tokens; byte-level BPE and SentencePiece-style pieces).
    """
    path = Path(directory) / "tokenizer.json"
    if not path.exists():
        raise ClawError(f"{directory}: no tokenizer.json (give an HF tokenizer or model directory)")
    try:
        from tokenizers import Tokenizer  # optional

        tok = Tokenizer.from_file(str(path))
        return lambda ids: tok.decode(list(ids), skip_special_tokens=False)
    except ImportError:
        pass
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
        vocab = spec["model"]["vocab"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ClawError(f"{path}: not a tokenizer.json with model.vocab ({exc})") from None
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        pieces = {i: p[0] for i, p in enumerate(vocab)}
    else:
        pieces = {int(i): t for t, i in vocab.items()}
    special = {}
    for added in spec.get("added_tokens") or []:
        special[int(added["id"])] = added["content"]
    byte_level = "ByteLevel" in json.dumps(spec.get("decoder")) or "ByteLevel" in json.dumps(
        spec.get("pre_tokenizer")
    )
    table = {c: b for b, c in _bytes_to_unicode().items()}

    def decode(ids: Sequence[int]) -> str:
        out: list[str] = []
        buf = bytearray()
        for i in ids:
            i = int(i)
            if i in special:
                out.append(buf.decode("utf-8", errors="replace"))
                buf.clear()
                out.append(special[i])
                continue
            piece = pieces.get(i, f"<unk:{i}>")
            if byte_level:
                for ch in piece:
                    if ch in table:
                        buf.append(table[ch])
                    else:
                        buf.extend(ch.encode("utf-8"))
            else:
                buf.extend(piece.replace("▁", " ").encode("utf-8"))
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    return decode


def _clip(text: str, max_chars: int) -> str:
    text = text.replace("\n", "\\n")
    if len(text) <= max_chars:
        return text
    half = max(max_chars // 2 - 2, 1)
    return f"{text[:half]} … {text[-half:]}"


def render_session(
    forest: Forest,
    name: str,
    *,
    decode: Decoder | None = None,
    max_chars: int = 100,
    max_spans: int = 20,
) -> str:
    """The tree of one session as indented text: one line per unbranched segment of tokens,
    with positions, token counts (context / output), the calls that generated them, branch
    points and leaves; below it the segment's context/output spans, with decoded text when
    ``decode`` is given."""
    tree = forest.session(name)
    lo, hi = tree.start, tree.stop
    parent = forest.parent[lo:hi] - lo
    parent[forest.parent[lo:hi] < 0] = -1
    n = hi - lo
    kids = np.bincount(parent[parent >= 0], minlength=n)
    children: dict[int, list[int]] = {}
    for j in np.flatnonzero(parent >= 0):
        children.setdefault(int(parent[j]), []).append(int(j))
    leaf_traj = {forest.trajectories[t].leaf - lo: t for t in tree.trajectories}
    lines = [
        f"session {name}: {len(tree.calls)} calls, {n} tree tokens, {len(tree.trajectories)} trajectories"
    ]

    def segment_end(j: int) -> int:
        while kids[j] == 1 and children[j][0] == j + 1:
            j += 1
        return j

    def emit(start: int, prefix: str, last: bool) -> None:
        end = segment_end(start)
        sl = slice(lo + start, lo + end + 1)
        gen = forest.trainable[sl]
        owners = sorted({forest.calls[c].call_id for c in forest.call[sl] if c >= 0})
        d0, d1 = int(forest.depth[lo + start]), int(forest.depth[lo + end])
        text = f"[{d0}..{d1}] {end - start + 1} tok ({int((~gen).sum())} context, {int(gen.sum())} output"
        text += f" by {', '.join(owners)})" if owners else ")"
        if end in leaf_traj:
            traj = forest.trajectories[leaf_traj[end]]
            text += f"  leaf: trajectory {traj.index}, calls {', '.join(traj.call_ids)}"
        elif kids[end] > 1:
            text += f"  branches into {kids[end]}"
        lines.append(f"{prefix}{'└─ ' if last else '├─ '}{text}")
        inner = prefix + ("   " if last else "│  ")
        owner = forest.call[sl]
        cuts = np.concatenate(([0], np.flatnonzero(np.diff(owner)) + 1, [len(owner)]))
        spans = list(zip(cuts[:-1], cuts[1:], strict=True))
        if len(spans) > 1 or decode is not None:
            for a, b in spans[:max_spans]:
                ci = int(owner[a])
                who = f"{forest.calls[ci].call_id} output" if ci >= 0 else "context"
                text = f"{inner}  {who} {b - a} tok"
                if decode is not None:
                    text += f': "{_clip(decode(forest.tokens[lo + start + a : lo + start + b].tolist()), max_chars)}"'
                lines.append(text)
            if len(spans) > max_spans:
                lines.append(f"{inner}  ... {len(spans) - max_spans} more spans")
        subs = children.get(end, [])
        for k, child in enumerate(subs):
            emit(child, inner, k == len(subs) - 1)

    roots = [int(j) for j in np.flatnonzero(parent < 0)]
    for k, root in enumerate(roots):
        emit(root, "", k == len(roots) - 1)
    return "\n".join(lines)
