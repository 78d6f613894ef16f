"""Tree packing: the mask, positions and leaf counts, and one packed forward pass equals one
ordinary forward pass per root-to-leaf path."""

from __future__ import annotations

import random
import shutil

import numpy as np
import pytest
import torch
from claw_rl import _tree_attention, packing
from claw_rl._tree_attention import chunked_tree_attention, tree_block_mask
from claw_rl.forward import backbone_hidden, token_logprobs
from claw_rl.learner import load_policy
from claw_rl.packing import ancestor_matrix, leaf_counts, pack, path_matrix, preorder
from claw_rl.records import Sample
from hypothesis import given, settings
from hypothesis import strategies as st
from rl_testlib import group_rollout, merge_group, random_tree, tree_sample

# the worked example of docs/formats.md: a b c d e, paths a-b-c and a-b-d-e
PARENT = [-1, 0, 1, 1, 3]


def test_ancestor_matrix_worked_example():
    """The mask of the documented example, row by row."""
    want = np.array(
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 1, 1]], bool
    )
    assert (ancestor_matrix(PARENT) == want).all()
    assert leaf_counts(PARENT).tolist() == [2, 2, 1, 1, 1]
    assert path_matrix(PARENT).astype(int).tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 1, 1]]


def test_chain_has_no_mask_and_padding_is_isolated():
    """Chains use the causal fast path; a tree batch pads with self-attending rows."""
    chain = Sample.from_dict(tree_sample([-1, 0, 1], [0, 1, 1]))
    assert pack([chain]).mask is None
    tree = Sample.from_dict(tree_sample(PARENT, [0, 1, 1, 1, 1]))
    b = pack([tree, chain])
    assert b.mask.shape == (2, 1, 5, 5)
    assert b.mask[1, 0, 3].tolist() == [False, False, False, True, False]
    assert b.trainable[1].tolist() == [False, True, True, False, False]


def _path_reference(model, sample: Sample) -> dict[int, float]:
    """Logprob of every trainable token from ordinary causal passes, one per root-to-leaf path."""
    out: dict[int, float] = {}
    for row in path_matrix(sample.parent):
        idx = np.nonzero(row)[0].tolist()
        ids = torch.tensor([[sample.input_ids[j] for j in idx]])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
        for k, j in enumerate(idx):
            if sample.trainable[j]:
                val = float(logp[k - 1, sample.input_ids[j]])
                assert out.setdefault(j, val) == pytest.approx(
                    val, abs=1e-5
                )  # same prefix, same value
    return out


def _random_samples(vocab: int, sizes: list[int], seed: int) -> list[Sample]:
    """Random forests (branches, occasional extra roots), every third non-root token context."""
    samples = []
    for k, n in enumerate(sizes):
        parent = random_tree(n, seed * 10 + k)
        trainable = [0 if p < 0 else int(j % 3 != 0) for j, p in enumerate(parent)]
        samples.append(
            Sample.from_dict(
                tree_sample(parent, trainable, seed=seed + k, sample_id=f"t{k}", vocab=vocab)
            )
        )
    return samples


@pytest.mark.parametrize("attention", ["dense", "tree"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tree_forward_equals_per_path_forward(tiny, seed, attention, monkeypatch):
    """Packed logprobs of a batch of random trees match per-path forwards to < 1e-5 (float32),
    with the dense mask and with tree attention (query chunks of 64: several per sample)."""
    monkeypatch.setattr(_tree_attention, "_CPU_CHUNK", 64)
    model = load_policy(tiny, torch.float32)
    samples = _random_samples(model.config.vocab_size, [140, 23, 257], seed)
    batch = pack(samples, attention=attention)
    assert (batch.mask is None) == (attention == "tree")
    with torch.no_grad():
        lp = token_logprobs(model, backbone_hidden(model, batch), batch).logprobs
    b, i, _ = batch.predictor_index()
    worst = 0.0
    for k, s in enumerate(samples):
        ref = _path_reference(model, s)
        got = {
            int(j): float(v)
            for bb, j, v in zip(b.tolist(), i.tolist(), lp.tolist(), strict=True)
            if bb == k
        }
        assert set(got) == set(ref)
        worst = max(worst, max(abs(got[j] - ref[j]) for j in ref))
    assert worst < 1e-5, worst


@st.composite
def forests(draw):
    n = draw(st.integers(1, 40))
    return [-1] + [draw(st.integers(-1, i - 1)) for i in range(1, n)]


@settings(max_examples=60, deadline=None)
@given(forests())
def test_mask_counts_and_paths_agree_with_a_naive_walk(parent):
    """Ancestors by walking parent pointers; leaf counts = rows of the path matrix through i."""
    A = ancestor_matrix(parent)
    for i in range(len(parent)):
        anc, j = {i}, parent[i]
        while j >= 0:
            anc.add(j)
            j = parent[j]
        assert set(np.nonzero(A[i])[0].tolist()) == anc
    P = path_matrix(parent)
    assert (P.sum(0) == leaf_counts(parent)).all()
    assert all(P[p, np.nonzero(P[p])[0].max()] for p in range(len(P)))  # each path ends at its leaf


def test_auto_layout_follows_the_dense_threshold(monkeypatch):
    """attention="auto": dense mask up to DENSE_MAX_TOKENS, tree intervals above; chains neither."""
    s = Sample.from_dict(tree_sample(PARENT, [0, 1, 1, 1, 1]))
    chain = Sample.from_dict(tree_sample([-1, 0, 1], [0, 1, 1]))
    assert pack([s]).mask is not None and pack([s]).tree_end is None
    monkeypatch.setattr(packing, "DENSE_MAX_TOKENS", 4)
    b = pack([s, chain])
    assert b.mask is None
    assert b.tree_order[0].tolist() == [0, 1, 2, 3, 4]  # the worked example is in preorder
    assert b.tree_end.tolist() == [[5, 5, 3, 5, 5], [3, 3, 3, 4, 5]]  # padding: itself only
    assert pack([chain, chain]).tree_end is None
    with pytest.raises(ValueError, match="attention"):
        pack([s], attention="sparse")


@settings(max_examples=60, deadline=None)
@given(forests())
def test_preorder_intervals_are_the_ancestor_relation(parent):
    """In preorder, k <= q < end[k] holds exactly when token order[k] is order[q] or its ancestor."""
    order, end = preorder(parent)
    assert sorted(order.tolist()) == list(range(len(parent)))
    A = ancestor_matrix(parent)[np.ix_(order, order)]  # A[q, k] in preorder positions
    k = np.arange(len(parent))
    want = (k[None, :] <= k[:, None]) & (k[:, None] < end[None, :])
    assert (want == A).all()


@pytest.mark.parametrize("seed", [0, 1])
def test_block_table_covers_the_tree_and_full_tiles_are_full(seed):
    """Every allowed (query, key) pair lies in a listed tile, tiles marked full allow every pair,
    and far fewer tiles than the dense N x N are listed."""
    parents = [random_tree(n, seed * 7 + k, branch=0.05) for k, n in enumerate([900, 611])]
    n = max(map(len, parents))
    end = np.tile(np.arange(1, n + 1), (2, 1))
    allowed = np.zeros((2, n, n), dtype=bool)
    for b, parent in enumerate(parents):
        order, end[b, : len(parent)] = preorder(parent)
        allowed[b, : len(parent), : len(parent)] = ancestor_matrix(parent)[np.ix_(order, order)]
    allowed[:, np.arange(n), np.arange(n)] = True  # padding attends to itself
    block = 16
    mask = tree_block_mask(torch.from_numpy(end), block=block)
    nb = -(-n // block)
    pad = np.zeros((2, nb * block, nb * block), dtype=bool)
    pad[:, :n, :n] = allowed
    tiles = pad.reshape(2, nb, block, nb, block)
    any_, all_ = tiles.any((2, 4)), tiles.all((2, 4))
    listed = np.zeros((2, nb, nb), dtype=bool)
    full = np.zeros((2, nb, nb), dtype=bool)
    for b in range(2):
        for qb in range(nb):
            listed[b, qb, mask.kv_indices[b, 0, qb, : mask.kv_num_blocks[b, 0, qb]].numpy()] = True
            fi = mask.full_kv_indices[b, 0, qb, : mask.full_kv_num_blocks[b, 0, qb]].numpy()
            full[b, qb, fi] = True
    assert (listed | full)[any_].all()  # nothing allowed is skipped
    assert not (listed & full).any()
    real = np.zeros_like(full)
    real[:, : (n // block), : (n // block)] = True  # whole tiles inside the real tokens
    assert all_[full & real].all()
    assert (listed | full).sum() < 0.2 * 2 * nb * nb


def test_chunked_attention_gradient_equals_dense_mask(monkeypatch):
    """Tree attention through query chunks (recomputed in backward): output and q/k/v gradients equal SDPA
    with the dense ancestor mask (GQA, two samples, padding)."""
    monkeypatch.setattr(_tree_attention, "_CPU_CHUNK", 64)
    parents = [random_tree(300, 5), random_tree(170, 6)]
    n = 300
    end = np.tile(np.arange(1, n + 1), (2, 1))
    dense = np.zeros((2, 1, n, n), dtype=bool)
    dense[:, 0, np.arange(n), np.arange(n)] = True
    for b, parent in enumerate(parents):
        order, end[b, : len(parent)] = preorder(parent)
        dense[b, 0, : len(parent), : len(parent)] = ancestor_matrix(parent)[np.ix_(order, order)]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, n, 32, generator=g, requires_grad=True)
    k, v = (torch.randn(2, 2, n, 32, generator=g, requires_grad=True) for _ in range(2))
    w = torch.randn(2, 4, n, 32, generator=g)
    outs, grads = [], []
    for run in ("dense", "chunked"):
        if run == "dense":
            o = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=torch.from_numpy(dense), enable_gqa=True
            )
        else:
            o = chunked_tree_attention(q, k, v, torch.from_numpy(end), None)  # chunks of 64
        outs.append(o.detach())
        grads.append(torch.autograd.grad((o * w).sum(), (q, k, v)))
    assert (outs[0] - outs[1]).abs().max() < 1e-5
    for a, b in zip(*grads, strict=True):
        assert (a - b).abs().max() < 1e-5


@pytest.mark.parametrize("attention", ["dense", "tree", "tree+checkpointing"])
def test_tree_gradient_equals_per_path_gradient(tiny, attention, monkeypatch):
    """Model gradient of a weighted logprob sum over packed trees equals that of per-path
    forwards where each token's weight is split over the paths through it (<= 1e-5, fp32);
    also with HF activation checkpointing (layers recomputed in backward)."""
    monkeypatch.setattr(_tree_attention, "_CPU_CHUNK", 64)
    model = load_policy(tiny, torch.float32)
    if attention.endswith("+checkpointing"):
        attention = "tree"
        enable = getattr(model, "activation_checkpointing_enable", None)
        (enable or model.gradient_checkpointing_enable)({"use_reentrant": False})
        model.train()  # HF checkpoints only in train mode (Qwen3 has no dropout)
    samples = _random_samples(model.config.vocab_size, [150, 90], seed=4)
    batch = pack(samples, attention=attention)
    b, i, _ = batch.predictor_index()
    w = torch.rand(len(b), generator=torch.Generator().manual_seed(0))
    w = w / w.sum()
    lp = token_logprobs(model, backbone_hidden(model, batch), batch).logprobs
    g_tree = torch.autograd.grad((w * lp).sum(), list(model.parameters()))
    weight = {(int(bb), int(j)): float(x) for bb, j, x in zip(b, i, w, strict=True)}
    ref = torch.zeros(())
    for k, s in enumerate(samples):
        c = leaf_counts(s.parent)
        for row in path_matrix(s.parent):
            idx = np.nonzero(row)[0].tolist()
            logp = torch.log_softmax(
                model(input_ids=torch.tensor([[s.input_ids[j] for j in idx]])).logits[0], -1
            )
            for t, j in enumerate(idx):
                if s.trainable[j]:
                    ref = ref + weight[(k, j)] / c[j] * logp[t - 1, s.input_ids[j]]
    g_ref = torch.autograd.grad(ref, list(model.parameters()))
    worst = max(float((a - r).abs().max()) for a, r in zip(g_tree, g_ref, strict=True))
    scale = max(float(r.abs().max()) for r in g_ref)
    assert scale > 1e-3 and worst <= 1e-5, (worst, scale)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's own imports
@pytest.mark.skipif(
    shutil.which("g++") is None, reason="compiled flex_attention needs a C++ compiler"
)
def test_flex_path_equals_chunked_path_forward():
    """The CUDA path (compiled flex_attention on the TreeMask's block table) gives the chunked
    path's output; flex has no CPU backward, so this compares forwards, on CPU."""
    parent = random_tree(700, 3, branch=0.05)
    order, end = preorder(parent)
    e = torch.from_numpy(end)[None]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, len(parent), 32, generator=g) for _ in range(3))
    with torch.no_grad():
        flex = _tree_attention.flex_tree_attention(q, k, v, tree_block_mask(e), None)
        chunked = chunked_tree_attention(q, k, v, e, None)
    assert (flex - chunked).abs().max() < 1e-5


def test_tree_attention_switch_is_sdpa_elsewhere_and_not_saved(tiny, tmp_path):
    """After a tree forward the model runs chains exactly as before (claw_tree is SDPA for any
    other mask), and a saved model's config names no claw_tree (other packages can load it)."""
    model = load_policy(tiny, torch.float32)
    ids = torch.tensor([[5, 9, 13, 7, 21]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
        s = Sample.from_dict(tree_sample(PARENT, [0, 1, 1, 1, 1], vocab=model.config.vocab_size))
        backbone_hidden(model, pack([s], attention="tree"))
        assert model.config._attn_implementation == _tree_attention.NAME
        assert torch.equal(model(input_ids=ids).logits, before)
    model.save_pretrained(tmp_path / "m")
    assert _tree_attention.NAME not in (tmp_path / "m" / "config.json").read_text()


def _canonical(sample: Sample) -> list[tuple]:
    """Every token as (its root-to-token ids, trainable, advantage, loss weight): the tree
    without its index order."""
    keys: list[tuple] = []
    for i, p in enumerate(sample.parent):
        keys.append((keys[p] if p >= 0 else ()) + (sample.input_ids[i],))
    rows = zip(keys, sample.trainable, sample.advantages, sample.loss_weights, strict=True)
    return sorted(rows)


@pytest.mark.parametrize("drop", [0, 1, 2])
def test_keep_sessions_cuts_a_group_sample_to_the_group_of_the_others(drop):
    """Dropping one session of a group-packed sample leaves the tree group packing makes of the
    other two (its own tokens gone, the shared prompt and context kept), with the per-session
    fields, offsets and path count to match."""
    rng = random.Random(1)
    system = [rng.randrange(3, 500) for _ in range(6)]
    sessions = [group_rollout(rng, k, system, 500, False) for k in range(3)]
    group = dict(merge_group(sessions), n_paths=6)
    group["tags"] = {**group["tags"], "session_rewards": [0.0, 1.0, 2.0]}
    kept = [s for k, s in enumerate(sessions) if k != drop]
    cut = packing.keep_sessions(Sample.from_dict(group), [k != drop for k in range(3)])
    want = Sample.from_dict(merge_group(kept))
    assert _canonical(cut) == _canonical(want)
    assert cut.sessions == want.sessions and cut.n_paths == 4
    assert cut.tags["session_rewards"] == [float(k) for k in range(3) if k != drop]
    Sample.from_dict(cut.to_dict())  # still a valid tree (parents precede children)
    sess = packing.session_index(cut)
    for k, name in enumerate(cut.sessions):  # each kept session's trainable tokens are its own
        own = [i for i, t in enumerate(cut.trainable) if t and sess[i] == k]
        theirs = [s for s in sessions if s["sample_id"] == name][0]
        assert len(own) == sum(theirs["trainable"])
