"""The loss equations, one pure function each. Shapes: (M,) = one entry per trainable token.

Symbols follow the papers: r = pi_theta / pi_old (the probability ratio), A = advantage,
eps = clip range, w = loss weight of a token, c = number of paths through a token.

Aggregation (how per-token losses l_i become one scalar) is a separate function per choice:

* :func:`weighted_sum` - claw-tree's loss weights: the mean over trajectories of each
  trajectory's mean token loss (GRPO, Shao et al. 2024, eq. 3). The default; exact on trees.
* :func:`token_mean` - DAPO's token-level loss (Yu et al. 2025, eq. 8): every token of every
  trajectory counts once, so long trajectories weigh more.
* :func:`constant_sum` - Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-like training"):
  sum of token losses over a constant (trajectories x a fixed length), no length bias.

DAPO's clip-higher is :func:`ppo_clip_loss` with ``eps_high > eps_low``.
"""

from __future__ import annotations

import torch


def ppo_clip_loss(logp: torch.Tensor, logp_old: torch.Tensor, A: torch.Tensor,
                  eps_low: float = 0.2, eps_high: float = 0.2) -> tuple[torch.Tensor, torch.Tensor]:
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
    """k1 estimator of KL(pi_theta || pi_ref) per token: log pi_theta - log pi_ref (Schulman, 2020)."""
    return logp - logp_ref


def kl_k3(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(pi_theta || pi_ref): exp(d) - d - 1, d = log pi_ref - log pi_theta.

    Unbiased and always >= 0 (Schulman, "Approximating KL divergence", 2020); GRPO's choice.
    """
    d = logp_ref - logp
    return torch.exp(d) - d - 1.0


def weighted_sum(lt: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """sum_i w_i l_i. With claw-tree's loss weights this is the mean over trajectories of the
    per-trajectory mean token loss, exactly, although shared tokens appear once."""
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


def value_loss(v: torch.Tensor, v_old: torch.Tensor, R: torch.Tensor, clip: float | None) -> torch.Tensor:
    """Clipped value loss per token: 0.5 max((v - R)^2, (v_old + clip(v - v_old, +-c) - R)^2).

    As in OpenAI baselines' PPO2 (and cleanrl); ``clip=None`` gives the plain 0.5 (v - R)^2.
    """
    unclipped = (v - R) ** 2
    if clip is None:
        return 0.5 * unclipped
    v_clipped = v_old + torch.clamp(v - v_old, -clip, clip)
    return 0.5 * torch.maximum(unclipped, (v_clipped - R) ** 2)


def approx_kl(logp: torch.Tensor, logp_old: torch.Tensor) -> torch.Tensor:
    """Mean k3 estimate of KL(pi_old || pi_theta) over tokens sampled from pi_old (a diagnostic)."""
    d = logp - logp_old
    return (torch.exp(d) - 1.0 - d).mean() if d.numel() else d.new_zeros(())


def explained_variance(v: torch.Tensor, R: torch.Tensor) -> float:
    """1 - Var[R - v] / Var[R]; nan when the returns have no variance."""
    var_R = torch.var(R, unbiased=False)
    if R.numel() < 2 or var_R.item() == 0:
        return float("nan")
    return float(1.0 - torch.var(R - v, unbiased=False) / var_R)
