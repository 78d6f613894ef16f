"""Tree packing: the mask, positions and leaf counts, and one packed forward pass equals one
ordinary forward pass per root-to-leaf path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from claw_rl.forward import backbone_hidden, token_logprobs
from claw_rl.learner import load_policy
from claw_rl.packing import ancestor_matrix, leaf_counts, pack, path_matrix
from claw_rl.records import Sample
from hypothesis import given, settings
from hypothesis import strategies as st
from rl_testlib import random_tree, tree_sample

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


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tree_forward_equals_per_path_forward(tiny, seed):
    """Packed logprobs of a batch of random trees match per-path forwards to < 1e-5 (float32)."""
    model = load_policy(tiny, torch.float32)
    vocab = model.config.vocab_size
    samples = []
    for k, n in enumerate([40, 23, 57]):
        parent = random_tree(n, seed * 10 + k)
        trainable = [0 if p < 0 else int(j % 3 != 0) for j, p in enumerate(parent)]
        samples.append(
            Sample.from_dict(
                tree_sample(parent, trainable, seed=seed + k, sample_id=f"t{k}", vocab=vocab)
            )
        )
    batch = pack(samples)
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
