"""Mismatch statistics and the TIS / MIS corrections."""

import math

import pytest
import torch
from claw_rl.consistency import (
    finish_mismatch,
    mis_sequence_keep,
    mis_token_mask,
    mismatch_stats,
    path_shares,
    tis_weights,
)
from claw_rl.packing import path_matrix


def test_mismatch_stats_hand_computed():
    """Mean/max abs diff, k1/k3 KL and the fraction beyond the threshold."""
    mine = torch.tensor([-1.0, -2.0, -0.5])
    eng = torch.tensor([-1.0, -2.5, -0.45])
    m = finish_mismatch(mismatch_stats(mine, eng, threshold=0.1))
    assert m["mismatch_mean_abs"] == pytest.approx((0 + 0.5 + 0.05) / 3)
    assert m["mismatch_max_abs"] == pytest.approx(0.5)
    assert m["mismatch_frac_beyond"] == pytest.approx(1 / 3)
    d = [0.0, 0.5, -0.05]
    assert m["mismatch_kl_k1"] == pytest.approx(sum(-x for x in d) / 3)
    assert m["mismatch_kl_k3"] == pytest.approx(sum(math.exp(x) - x - 1 for x in d) / 3)


def test_tis_truncates_and_mis_masks():
    """TIS = min(rho, C); MIS token mask keeps lo <= rho <= hi."""
    old = torch.log(torch.tensor([0.5, 0.3, 0.9]))
    eng = torch.log(torch.tensor([0.5, 0.1, 0.3]))  # rho = 1, 3, 3
    assert tis_weights(old, eng, cap=2.0).tolist() == pytest.approx([1.0, 2.0, 2.0])
    old2 = torch.log(torch.tensor([0.5, 0.1, 0.2]))  # rho = 1, 1, 2/3
    assert mis_token_mask(old2, eng, 0.8, 1.25).tolist() == [1.0, 1.0, 0.0]


def test_mis_sequence_on_a_tree():
    """Path a-b-c kept, path a-b-d-e dropped: shared b keeps path 1's share, 1/2 : 1/3 of the
    weight under 1/T_p shares, 1 : 1 under equal shares."""
    parent = [-1, 0, 1, 1, 3]
    trainable = torch.tensor([0, 1, 1, 1, 1], dtype=torch.bool)
    paths = torch.from_numpy(path_matrix(parent))
    log_rho = torch.tensor(
        [0.0, 0.0, 0.0, 0.03, 0.03], dtype=torch.float64
    )  # path 2 mean 0.02 > 0.01
    keep = mis_sequence_keep(
        log_rho, paths, trainable, 0.01, path_shares(paths, trainable, "inverse_length")
    )
    assert keep.tolist() == pytest.approx([1.0, (1 / 2) / (1 / 2 + 1 / 3), 1.0, 0.0, 0.0])
    keep = mis_sequence_keep(
        log_rho, paths, trainable, 0.01, path_shares(paths, trainable, "equal")
    )
    assert keep.tolist() == pytest.approx([1.0, 0.5, 1.0, 0.0, 0.0])
    keep = mis_sequence_keep(
        log_rho, paths, trainable, 0.05, path_shares(paths, trainable, "equal")
    )
    assert keep.tolist() == [1.0] * 5  # inside the wider band


def test_mis_sequence_band_is_symmetric_in_log_space():
    """A path drifting by -0.02 per token is dropped like one drifting by +0.02; +-0.005 is kept."""
    parent = [-1, 0, 1]
    trainable = torch.tensor([0, 1, 1], dtype=torch.bool)
    paths = torch.from_numpy(path_matrix(parent))
    shares = path_shares(paths, trainable, "equal")
    for drift, kept in ((0.02, 0.0), (-0.02, 0.0), (0.005, 1.0), (-0.005, 1.0)):
        log_rho = torch.tensor([0.0, drift, drift], dtype=torch.float64)
        assert mis_sequence_keep(log_rho, paths, trainable, 0.01, shares)[1:].tolist() == [
            kept,
            kept,
        ]
