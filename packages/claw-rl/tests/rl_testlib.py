"""Shared helpers for the claw-rl tests: hand-built tree samples and random trees."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys

import numpy as np
from claw_rl.records import Sample


def tree_sample(
    parent: list[int],
    trainable: list[int],
    *,
    seed: int = 0,
    sample_id: str = "s",
    vocab: int = 2000,
    returns: bool = False,
    weights: list[float] | None = None,
    versions: list[int] | None = None,
    logprobs: list[float] | None = None,
) -> dict:
    """A claw.sample/v1 dict for a given forest; random tokens and advantages (seeded)."""
    rng = random.Random(seed)
    n = len(parent)
    pos = []
    for p in parent:
        pos.append(0 if p < 0 else pos[p] + 1)
    adv = [round(rng.uniform(-1, 1), 3) if t else 0.0 for t in trainable]
    row = {
        "schema": "claw.sample/v1",
        "sample_id": sample_id,
        "algo": "ppo" if returns else "grpo",
        "input_ids": [rng.randrange(3, vocab) for _ in range(n)],
        "position_ids": pos,
        "parent": parent,
        "trainable": trainable,
        "logprobs": logprobs
        if logprobs is not None
        else [round(-rng.uniform(0, 8), 3) if t else 0.0 for t in trainable],
        "advantages": adv,
        "loss_weights": weights
        if weights is not None
        else [1.0 / max(sum(trainable), 1) * t for t in trainable],
    }
    if returns:
        row["returns"] = [round(rng.uniform(-1, 1), 3) if t else 0.0 for t in trainable]
    if versions is not None:
        row["policy_versions"] = versions
    Sample.from_dict(row)  # the helper only builds valid samples
    return row


def random_tree(n: int, seed: int, branch: float = 0.3) -> list[int]:
    """A random forest in topological order: mostly chains with occasional branches."""
    rng = random.Random(seed)
    parent = [-1]
    for i in range(1, n):
        if rng.random() < branch:
            parent.append(rng.randrange(-1, i) if rng.random() < 0.1 else rng.randrange(0, i))
        else:
            parent.append(i - 1)
    return parent


def group_rollout(rng: random.Random, k: int, system: list[int], vocab: int, ppo: bool) -> dict:
    """One rollout: the shared system prompt, a main thread of two turns, a side branch inside
    the prompt (a sub-agent), and a context-only leaf; per-session loss weights 1/(R U)."""
    ids, parent, trainable = [], [], []

    def chain(start: int, tokens: list[int], train: int) -> int:
        for t in tokens:
            ids.append(t)
            parent.append(start)
            trainable.append(train)
            start = len(ids) - 1
        return start

    rand = lambda n: [rng.randrange(3, vocab) for _ in range(n)]  # noqa: E731
    end = chain(-1, system, 0)
    node = chain(end, rand(3), 1)  # first answer
    node = chain(node, rand(2), 0)  # tool result
    chain(node, rand(4), 1)  # second answer
    mid = len(system) // 2 - 1
    node = chain(mid, rand(2), 0)  # sub-agent: branches inside the prompt
    chain(node, rand(3), 1)
    chain(end, [7, 8], 0)  # a context-only call (e.g. token counting): a leaf, never merged
    n = len(ids)
    pos = []
    for p in parent:
        pos.append(0 if p < 0 else pos[p] + 1)
    tr = np.asarray(trainable, dtype=bool)
    row = {
        "schema": "claw.sample/v1",
        "sample_id": f"r{k}",
        "algo": "ppo" if ppo else "grpo",
        "input_ids": ids,
        "position_ids": pos,
        "parent": parent,
        "trainable": trainable,
        "logprobs": [0.0] * n,
        "advantages": np.where(tr, rng.uniform(-1, 1), 0.0).tolist(),
        "loss_weights": (tr / (3 * tr.sum())).tolist(),
        "tags": {"path_weighting": "token"},
    }
    if ppo:
        row["returns"] = [rng.uniform(-1, 1) if t else 0.0 for t in trainable]
    return row


def merge_group(samples: list[dict]) -> dict:
    """Reference group packing: concatenate the samples, then keep one copy of every inner
    context-prefix node, identified by its token prefix."""
    per_token = ("input_ids", "position_ids", "trainable", "logprobs", "advantages")
    per_token += ("loss_weights",) + (("returns",) if "returns" in samples[0] else ())
    per_token += ("policy_versions",) if "policy_versions" in samples[0] else ()
    out: dict = {k: [] for k in (*per_token, "parent")}
    seen: dict[tuple, int] = {}  # token prefix of a merged node -> its index in out
    offsets = []  # each sample's first own token (claw-tree's tags.session_offsets)
    for s in samples:
        offsets.append(len(out["input_ids"]))
        inner = set(s["parent"])
        prefix: list[tuple] = []
        index: list[int] = []  # this sample's token -> index in out
        for i, p in enumerate(s["parent"]):
            key = (prefix[p] if p >= 0 else ()) + (s["input_ids"][i],)
            prefix.append(key)
            context_prefix = not s["trainable"][i] and (p < 0 or prefix[p] in seen)
            if context_prefix and i in inner and key in seen:
                index.append(seen[key])
                continue
            index.append(len(out["input_ids"]))
            if context_prefix and i in inner:
                seen[key] = index[-1]
            for k in per_token:
                out[k].append(s[k][i])
            out["parent"].append(index[p] if p >= 0 else -1)
    return {
        **{k: v for k, v in samples[0].items() if k not in out},
        **out,
        "sample_id": "group",
        "sessions": [s["sample_id"] for s in samples],
        "tags": {**samples[0].get("tags", {}), "session_offsets": offsets},
    }


def run_checked(cmd: list[str]) -> None:
    """Run cmd (OMP_NUM_THREADS=1); fail with the tail of its stderr unless it exits 0."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]


def torchrun_cmd(nproc: int, *target: str) -> list[str]:
    """The command running target (a script, or -m module, and its args) under torchrun with
    nproc local ranks on a free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
            "--nproc_per_node", str(nproc), "--master_addr", "127.0.0.1",
            "--master_port", str(port), *target]  # fmt: skip


def sft_chain_rows() -> list[dict]:
    """Two SFT chain samples: a prompt of 4 tokens, a completion of 6."""
    rows = []
    for k in range(2):
        ids = [(37 * k + 11 * i) % 900 + 3 for i in range(10)]
        rows.append(
            {
                "schema": "claw.sample/v1",
                "sample_id": f"s{k}",
                "algo": "sft",
                "input_ids": ids,
                "position_ids": list(range(10)),
                "parent": list(range(-1, 9)),
                "trainable": [0] * 4 + [1] * 6,
                "logprobs": [0.0] * 10,
                "advantages": [0.0] * 10,
                "loss_weights": [0.0] * 4 + [1 / 12] * 6,
            }
        )
    return rows


def write_rows(path, rows):
    """`rows` as a JSONL file at `path`."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
