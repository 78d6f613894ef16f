"""Loss equations against hand-computed values on small tensors."""

import math

import attrs
import numpy as np
import pytest
import torch
from claw_rl import losses
from claw_rl.packing import chain_sample, leaf_counts
from claw_rl.parts import Aggregation


def test_ppo_clip_loss_hand_computed():
    """Ratios inside, above and below the clip range, with positive and negative advantages."""
    r = torch.tensor([1.0, 1.5, 0.5, 1.5, 0.5])
    A = torch.tensor([2.0, 1.0, 1.0, -1.0, -1.0])
    lt, clipped = losses.ppo_clip_loss(torch.log(r), torch.zeros(5), A, 0.2, 0.2)
    # min(rA, clip(r)A): 2 | min(1.5, 1.2)=1.2 | min(0.5, 0.8)=0.5 | min(-1.5,-1.2)=-1.5 | min(-0.5,-0.8)=-0.8
    assert lt.tolist() == pytest.approx([-2.0, -1.2, -0.5, 1.5, 0.8])
    assert clipped.tolist() == [0, 1, 0, 0, 1]


def test_clip_higher_widens_only_the_upper_range():
    """DAPO clip-higher: eps_high = 0.28 lets r = 1.25 through for a positive advantage."""
    lt, clipped = losses.ppo_clip_loss(
        torch.log(torch.tensor([1.25, 0.7])), torch.zeros(2), torch.tensor([1.0, -1.0]), 0.2, 0.28
    )
    assert lt.tolist() == pytest.approx([-1.25, 0.8])
    assert clipped.tolist() == [0, 1]


def test_kl_estimators():
    """k1 = log p - log q; k3 = exp(d) - d - 1 with d = log q - log p, 0 when equal."""
    lp, lq = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -2.0])
    assert losses.kl_k1(lp, lq).tolist() == pytest.approx([0.5, 0.0])
    assert losses.kl_k3(lp, lq).tolist() == pytest.approx([math.exp(-0.5) + 0.5 - 1.0, 0.0])
    assert losses.kl_k3_loss(lp, lq).tolist() == pytest.approx(losses.kl_k3(lp, lq).tolist())
    assert losses.kl_k2_loss(lp, lq).tolist() == pytest.approx([0.125, 0.0])


def _expected_grad(loss_fn, theta: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """E_{y ~ pi_theta}[grad loss(log pi(y), log ref(y))], exactly, by summing over the vocabulary."""
    theta = theta.clone().requires_grad_(True)
    logp = torch.log_softmax(theta, -1)
    per_y = loss_fn(logp, torch.log_softmax(ref, -1))  # (V,) the loss if y were sampled
    total = torch.zeros_like(theta)
    for y in range(len(theta)):
        (g,) = torch.autograd.grad(per_y[y], theta, retain_graph=True)
        total += logp[y].exp().detach() * g
    return total


@pytest.mark.parametrize("name", ["kl_k2_loss", "kl_k3_loss"])
def test_kl_losses_have_the_reverse_kl_gradient(name):
    """k2 and the corrected k3: expected gradient over y ~ pi = grad KL(pi || ref), exactly."""
    gen = torch.Generator().manual_seed(0)
    theta, ref = (
        torch.randn(7, generator=gen, dtype=torch.float64),
        torch.randn(7, generator=gen, dtype=torch.float64),
    )
    t = theta.clone().requires_grad_(True)
    logp, logr = torch.log_softmax(t, -1), torch.log_softmax(ref, -1)
    (true,) = torch.autograd.grad((logp.exp() * (logp - logr)).sum(), t)
    got = _expected_grad(getattr(losses, name), theta, ref)
    assert torch.allclose(got, true, atol=1e-12)


def test_k1_and_plain_k3_have_the_wrong_gradient():
    """k1 as a loss: zero expected gradient; k3 as a loss: the gradient of KL(ref || pi)."""
    gen = torch.Generator().manual_seed(1)
    theta, ref = (
        torch.randn(7, generator=gen, dtype=torch.float64),
        torch.randn(7, generator=gen, dtype=torch.float64),
    )
    assert torch.allclose(
        _expected_grad(losses.kl_k1, theta, ref), torch.zeros(7, dtype=torch.float64), atol=1e-12
    )
    t = theta.clone().requires_grad_(True)
    logr = torch.log_softmax(ref, -1)
    (forward,) = torch.autograd.grad((logr.exp() * (logr - torch.log_softmax(t, -1))).sum(), t)
    assert torch.allclose(_expected_grad(losses.kl_k3, theta, ref), forward, atol=1e-12)


def test_whiten_uses_the_loss_mass():
    """Weighted moments: a token shared by two paths (q = 2) counts twice, as in the flat batch."""
    A = torch.tensor([1.0, 3.0])
    mean, std = losses.whiten(A, torch.tensor([2.0, 1.0]), eps=0.0)
    flat = torch.tensor([1.0, 1.0, 3.0])
    assert mean == pytest.approx(float(flat.mean()))
    assert std == pytest.approx(float(flat.std(unbiased=False)))
    assert losses.whiten(A, torch.zeros(2)) == (0.0, 1.0)
    assert losses.whiten(A, torch.tensor([2.0, 1.0]), eps=0.0, center=False) == (0.0, std)


def test_whiten_floor_bounds_the_gain_on_a_saturated_batch():
    """Near-identical advantages are scaled at most 1/floor; a spread batch is whitened as before."""
    q = torch.ones(4)
    tiny = torch.tensor([1.0, 1.0 + 1e-4, 1.0 - 1e-4, 1.0], dtype=torch.float64)
    mean, scale = losses.whiten(tiny, q, std_floor=0.1)
    assert scale == pytest.approx(0.1)
    assert float(((tiny - mean) / scale).abs().max()) <= 1e-4 / 0.1 + 1e-9
    spread = torch.tensor([0.0, 1.0, 0.0, 1.0])
    assert losses.whiten(spread, q, std_floor=0.1) == losses.whiten(spread, q)


def test_aggregations():
    """weighted_sum, DAPO token_mean (leaf counts) and Dr. GRPO constant normaliser."""
    lt = torch.tensor([1.0, 2.0, 3.0])
    w = torch.tensor([0.5, 0.25, 0.25])
    c = torch.tensor([2.0, 1.0, 1.0])
    assert float(losses.weighted_sum(lt, w)) == pytest.approx(0.5 + 0.5 + 0.75)
    assert float(losses.token_mean(lt, c)) == pytest.approx((2 + 2 + 3) / 4)
    assert float(losses.constant_sum(lt, c, n_traj=2, max_len=10)) == pytest.approx(7 / 20)


def test_value_loss_clipping():
    """The clipped branch wins when the new value moved past the clip range away from R."""
    v_old, R = torch.tensor([0.0, 0.0]), torch.tensor([1.0, -1.0])
    v = torch.tensor([0.5, 0.5])
    # token 0: unclipped (0.5-1)^2 = .25, clipped v=0.2 -> .64 -> max .64 ; token 1: (1.5)^2=2.25 vs (1.2)^2=1.44
    assert losses.value_loss(v, v_old, R, 0.2).tolist() == pytest.approx([0.32, 1.125])
    assert losses.value_loss(v, v_old, R, None).tolist() == pytest.approx([0.125, 1.125])


def test_explained_variance_and_approx_kl():
    """Perfect values explain everything; constant returns give nan; identical policies KL 0."""
    R = torch.tensor([1.0, 2.0, 3.0])
    assert losses.explained_variance(R, R) == pytest.approx(1.0)
    assert losses.explained_variance(torch.zeros(3), R) == pytest.approx(0.0)
    assert math.isnan(losses.explained_variance(R, torch.ones(3)))
    assert losses.approx_kl(torch.tensor([-1.0]), torch.tensor([-1.0])).tolist() == [0.0]


def test_constant_counts_trainable_trajectories_only():
    """Dr. GRPO's constant normaliser counts the paths that hold a trainable token: a context-only
    call (token counting, a passthrough call) adds a leaf but no trajectory."""
    main = chain_sample("s", [5, 6, 7], [8, 9])
    # the same rollout plus a context-only call branching off the prompt: tokens 5 6 -> 3 4
    side = attrs.evolve(
        main,
        input_ids=(*main.input_ids, 3, 4),
        position_ids=(*main.position_ids, 2, 3),
        parent=(*main.parent, 1, 5),
        trainable=(*main.trainable, 0, 0),
        logprobs=(*main.logprobs, 0.0, 0.0),
        advantages=(*main.advantages, 0.0, 0.0),
        loss_weights=(*main.loss_weights, 0.0, 0.0),
    )
    assert leaf_counts(side.parent)[0] == 2  # two leaves, one trajectory
    agg = Aggregation("constant", 8)
    mass = np.ones(2)
    assert agg.for_minibatch([side], mass, mass).n_traj == 1.0
    assert agg.for_minibatch([main, side], mass, mass).n_traj == 2.0
