"""The loss equations, one pure function each. Shapes: (M,) = one entry per trainable token.

Symbols follow the papers: r = pi_theta / pi_old (the probability ratio), A = advantage,
eps = clip range, w = loss weight of a token, c = number of paths through a token.

Aggregation (how per-token losses l_i become one scalar) is a separate function per choice:

* :func:`weighted_sum` - claw-tree's loss weights (each rollout's vote spread over its tokens,
  or the per-trajectory mean of GRPO, Shao et al. 2024, eq. 3). The default; exact on trees.
* :func:`token_mean` - DAPO's token-level loss (Yu et al. 2025, eq. 8): every token of every
  trajectory counts once, so long trajectories weigh more.
* :func:`constant_sum` - Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-like training"):
  sum of token losses over a constant (trajectories x a fixed length), no length bias.

Masked importance sampling multiplies l_i by a keep fraction m_i in [0, 1]; the normalisers of
:func:`weighted_sum` and :func:`token_mean` then count only the kept mass (sum w_i m_i, sum
c_i m_i): masked tokens leave the denominator, as in a flat batch whose masked tokens were never
there. :func:`constant_sum` keeps its constant by definition.

KL penalties to a reference policy (Schulman 2020, "Approximating KL divergence"; Tang & Munos
2025, "On a few pitfalls in KL divergence gradient estimation for RL"). Used as a loss on
tokens sampled from pi, an estimator's *gradient* is what matters, not its value:
k1 = log pi - log ref has zero expected gradient (E_pi[grad log pi] = 0); k3 has the gradient
of KL(ref || pi), the other direction. :func:`kl_k2_loss` and :func:`kl_k3_loss` both have the
gradient of KL(pi || ref).

DAPO's clip-higher is :func:`ppo_clip_loss` with ``eps_high > eps_low``.
"""

from __future__ import annotations

import torch


def ppo_clip_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    A: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped surrogate per token (Schulman et al. 2017, eq. 7), negated to be minimised.

    l = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A),  r = exp(logp - logp_old).

    Deviation: two clip ranges (DAPO's clip-higher); equal ranges give the paper's loss.
    Returns ``(l, clipped)``, ``clipped`` = 1.0 where the clipped branch was taken.
    """
    r = torch.exp(logp - logp_old)  # (M,)
    unclipped = r * A
    clipped_obj = torch.clamp(r, 1.0 - eps_low, 1.0 + eps_high) * A
    obj = torch.minimum(unclipped, clipped_obj)
    return -obj, (clipped_obj < unclipped).float()


def kl_k1(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """k1 estimate of KL(pi_theta || pi_ref) per token: log pi_theta - log pi_ref (Schulman, 2020).

    Unbiased for the value; as a loss its expected gradient is 0, so it is a diagnostic only.
    """
    return logp - logp_ref


def kl_k3(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(pi_theta || pi_ref) per token: exp(d) - d - 1, d = log pi_ref - log pi_theta.

    Unbiased for the value and always >= 0 (Schulman, 2020). Its gradient, (1 - ref/pi) grad log pi,
    has expectation grad KL(pi_ref || pi_theta) (Tang & Munos 2025, sec. 3): do not minimise it
    directly, use :func:`kl_k3_loss`.
    """
    d = logp_ref - logp
    return torch.exp(d) - d - 1.0


def kl_k2_loss(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """k2 = 0.5 (log pi_theta - log pi_ref)^2 per token, on tokens sampled from pi_theta.

    gradient (log pi_theta - log pi_ref) grad log pi_theta, whose expectation is exactly
    grad KL(pi_theta || pi_ref) (Schulman 2020; Tang & Munos 2025, sec. 4). The value is a biased
    (low-variance) estimate of the KL, close to it when the two policies are close.
    Deviations: (1) per token, the gradient of sum_t KL(pi(.|s_t) || ref(.|s_t)) at the visited
    states, not of the whole sequence's KL (that needs the KL in the reward); (2) tokens come
    from pi_old, exact at the first epoch and approximately so later (no ratio correction).
    """
    return 0.5 * (logp - logp_ref) ** 2


def kl_k3_loss(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """k3 as a differentiable loss with the gradient of KL(pi_theta || pi_ref).

    l = k3 + sg(k3) * (log pi - sg(log pi)): the value is k3 (unbiased, >= 0), and the added
    score-function term (zero in value) supplies the part of grad E_pi[k3] that comes from the
    sampling distribution. The gradient, k3 grad log pi + (1 - ref/pi) grad log pi
    = (log pi - log ref) grad log pi, equals :func:`kl_k2_loss`'s pointwise (Tang & Munos 2025,
    "On a few pitfalls in KL divergence gradient estimation for RL"). Same deviations as k2.
    """
    k3 = kl_k3(logp, logp_ref)
    return k3 + k3.detach() * (logp - logp.detach())


def weighted_sum(lt: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """sum_i w_i l_i. With claw-tree's loss weights (sum 1 over a batch) this is the batch's loss
    exactly, although shared tokens appear once: w_i = sum_{p holds i} u_{p,i}, u = the share of
    path p (see docs/formats.md, Loss weights)."""
    return (w * lt).sum()


def token_mean(lt: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """DAPO token-level mean: sum_i c_i l_i / sum_i c_i, c_i = paths through token i.

    A token shared by c paths stands for c tokens of the flat batch, so this equals the mean
    over all trajectory tokens of the flat (per-path) batch. Trajectory weights are ignored.
    """
    return (c * lt).sum() / c.sum().clamp(min=1.0)


def constant_sum(lt: torch.Tensor, c: torch.Tensor, n_traj: float, max_len: float) -> torch.Tensor:
    """Dr. GRPO: sum_i c_i l_i / (n_traj * max_len), a constant normaliser (no length bias)."""
    return (c * lt).sum() / (n_traj * max_len)


def whiten(
    A: torch.Tensor,
    q: torch.Tensor,
    eps: float = 1e-8,
    std_floor: float = 0.0,
    center: bool = True,
) -> tuple[float, float]:
    """(mean, scale) of the advantages A (M,) under token weights q (M,), for A' = (A - mean) / scale.

    Advantage normalisation as in PPO implementations (Huang et al. 2022, "The 37 implementation
    details of PPO", detail 7; cleanrl's norm_adv: (A - mean) / (std + 1e-8); verl's
    masked_whiten: (A - mean) * rsqrt(var + 1e-8)). Deviations: the moments are weighted by q,
    the token's mass in the loss (loss weight or path count), so that they are those of the
    flat per-path batch and tree packing leaves them unchanged; over the whole batch, not the
    minibatch. scale = max(std, std_floor) + eps (population std): cleanrl's eps and verl's
    (std >= 1e-4) only guard the division, so a saturated batch (rewards nearly all equal, A
    mostly value-head noise) is blown up to std 1 and its noise drives the policy; the floor
    bounds that gain by 1 / std_floor, so such a batch is centred and scaled no more than that,
    and a batch with std >= std_floor is whitened exactly as without it. ``center=False``
    returns mean 0 (divide by the std only), so every advantage keeps its sign.
    """
    q = q.double()
    total = float(q.sum())
    if total <= 0:
        return 0.0, 1.0
    A = A.double()
    mean = float((q * A).sum()) / total
    var = float((q * (A - mean) ** 2).sum()) / total
    return (mean if center else 0.0), max(var**0.5, std_floor) + eps


def value_loss(
    v: torch.Tensor, v_old: torch.Tensor, R: torch.Tensor, clip: float | None
) -> torch.Tensor:
    """Clipped value loss per token: 0.5 max((v - R)^2, (v_old + clip(v - v_old, +-c) - R)^2).

    As in OpenAI baselines' PPO2 (and cleanrl); ``clip=None`` gives the plain 0.5 (v - R)^2.
    """
    unclipped = (v - R) ** 2
    if clip is None:
        return 0.5 * unclipped
    v_clipped = v_old + torch.clamp(v - v_old, -clip, clip)
    return 0.5 * torch.maximum(unclipped, (v_clipped - R) ** 2)


def approx_kl(logp: torch.Tensor, logp_old: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(pi_old || pi_theta) per token sampled from pi_old (a diagnostic, (M,))."""
    d = logp - logp_old
    return torch.exp(d) - 1.0 - d


def explained_variance(v: torch.Tensor, R: torch.Tensor) -> float:
    """1 - Var[R - v] / Var[R]; nan when the returns have no variance."""
    var_R = torch.var(R, unbiased=False)
    if R.numel() < 2 or var_R.item() == 0:
        return float("nan")
    return float(1.0 - torch.var(R - v, unbiased=False) / var_R)
