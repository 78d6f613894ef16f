"""Shared helpers for the claw-tree tests: record builders, random corpora and reference implementations."""

from __future__ import annotations

import random

import hypothesis.strategies as st
import numpy as np


def call(
    session,
    seq,
    prompt,
    completion,
    *,
    call_id=None,
    logprobs=None,
    trainable=True,
    version=0,
    model="policy",
    prefix=None,
):
    """A valid claw.call/v1 dict."""
    row = {
        "schema": "claw.call/v1",
        "call_id": call_id or f"{session}-c{seq}",
        "session": session,
        "seq": seq,
        "api": "openai.chat",
        "model": model,
        "policy": {"name": "tiny", "version": version},
        "trainable": trainable,
        "prompt_ids": list(prompt),
        "completion_ids": list(completion),
        "completion_logprobs": list(logprobs)
        if logprobs is not None
        else [-0.01 * (seq + 1) - 0.001 * i for i in range(len(completion))],
        "finish_reason": "stop",
        "started_at": 1.0 + seq,
        "ended_at": 1.5 + seq,
        "tags": {"task": "t", "harness": "h"},
    }
    if prefix is not None:
        row["prefix"] = prefix
    return row


def outcome(session, reward, *, task="t", harness="h", group=None, status="ok"):
    """A valid claw.outcome/v1 dict."""
    return {
        "schema": "claw.outcome/v1",
        "session": session,
        "task": task,
        "harness": harness,
        "group": group or task,
        "reward": reward if status == "ok" else None,
        "passed": (reward >= 1.0) if status == "ok" else None,
        "status": status,
    }


def random_session(rng: random.Random, session: str, n_calls: int, alphabet: int = 4) -> list[dict]:
    """Calls of one session that mostly extend earlier calls and sometimes diverge.

    Each call picks an earlier call's prompt + completion (or nothing), keeps a random prefix
    of it (all of it most of the time), appends a few context tokens and samples a completion.
    A small alphabet makes accidental shared prefixes and identical sequences common.
    """
    seqs: list[list[int]] = []
    calls = []
    for k in range(n_calls):
        base: list[int] = []
        if seqs and rng.random() < 0.9:
            base = list(rng.choice(seqs))
            if rng.random() < 0.3:
                base = base[: rng.randint(0, len(base))]
        prompt = base + [rng.randrange(alphabet) for _ in range(rng.randint(0 if base else 1, 3))]
        completion = [rng.randrange(alphabet) for _ in range(rng.randint(0, 4))]
        trainable = rng.random() > 0.1
        calls.append(
            call(
                session,
                k,
                prompt,
                completion,
                trainable=trainable,
                version=k % 2,
                logprobs=[-rng.random() for _ in completion],
            )
        )
        seqs.append(prompt + completion)
    return calls


@st.composite
def corpora(draw, max_sessions: int = 4, max_calls: int = 6):
    """(calls, outcomes): random sessions, shuffled, with some duplicated records."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = random.Random(seed)
    n_sessions = draw(st.integers(1, max_sessions))
    calls, outcomes = [], []
    for s in range(n_sessions):
        name = f"s{s}"
        calls += random_session(rng, name, draw(st.integers(1, max_calls)))
        outcomes.append(outcome(name, float(rng.choice([0.0, 0.25, 1.0])), task=f"task{s % 2}"))
    calls += [dict(c) for c in rng.sample(calls, k=min(len(calls), draw(st.integers(0, 3))))]
    rng.shuffle(calls)
    return calls, outcomes


def prefix_keys(input_ids, parent):
    """The token prefix (root..token) of every packed token, from the parent array."""
    keys: list[tuple] = []
    for i, p in enumerate(parent):
        keys.append((keys[p] if p >= 0 else ()) + (input_ids[i],))
    return keys


def naive_trie(calls):
    """Reference: a per-token dict trie per session, keyed by (session, prefix tuple).

    Value: [generated, logprob, version] from the earliest (seq, call_id) call that generated
    the token (a root token is never trainable); duplicates by call_id count once.
    """
    seen = {}
    for c in calls:
        seen.setdefault(c["call_id"], c)
    nodes: dict[tuple, list] = {}
    for c in sorted(seen.values(), key=lambda c: (c["session"], c["seq"], c["call_id"])):
        seq = c["prompt_ids"] + c["completion_ids"]
        p = len(c["prompt_ids"])
        for k in range(len(seq)):
            node = nodes.setdefault((c["session"], tuple(seq[: k + 1])), [False, 0.0, -1])
            if c.get("trainable", True) and k >= max(p, 1) and not node[0]:
                node[:] = [True, c["completion_logprobs"][k - p], c["policy"]["version"]]
    return nodes


def flat_gae(act, V, r, gamma, lam):
    """GAE along one path, context tokens passing the signal through (a plain backward loop)."""
    A = np.zeros(len(act))
    q_next, a_next = 0.0, 0.0
    for t in range(len(act) - 1, -1, -1):
        if act[t]:
            A[t] = r[t] + q_next - V[t] + gamma * lam * a_next
            q_next, a_next = gamma * V[t], A[t]
        else:
            q_next = r[t] + q_next
    return A
