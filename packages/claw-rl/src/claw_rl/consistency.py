"""Training-inference consistency: how far the learner's logprobs are from the engine's, and
importance weights that correct for it.

The engine (vLLM, claw-proxy's transformers engine) samples from pi_engine, which differs from
the learner's pi_old by kernels, precision and batching. The policy gradient estimated on
engine samples is corrected by rho = pi_old / pi_engine per token:

* :func:`tis_weights` - truncated importance sampling, min(rho, C) (Yao et al. 2025, "Your
  efficient RL framework secretly brings you off-policy RL training").
* :func:`mis_token_mask` - masked importance sampling: drop tokens with rho outside [lo, hi]
  (Liu et al. 2025, "When speed kills stability"; token level).
* :func:`mis_sequence_keep` - the same on whole trajectories: a path is dropped when its
  geometric-mean rho leaves [lo, hi]. On a tree a token shared by kept and dropped paths keeps
  the kept paths' share of its weight (shares are 1/T_p, as in the loss weights).
"""

from __future__ import annotations

import torch


def mismatch_stats(logp_learner: torch.Tensor, logp_engine: torch.Tensor, threshold: float) -> dict:
    """Sums and maxima over tokens (M,) so that shards can be combined; see :func:`finish_mismatch`.

    KL(engine || learner) is estimated on engine samples with k1 (mean of log pi_e - log pi_l)
    and k3 (mean of exp(d) - d - 1, d = log pi_l - log pi_e; always >= 0).
    """
    d = (logp_learner - logp_engine).double()
    return {
        "n": float(d.numel()),
        "abs_sum": float(d.abs().sum()),
        "abs_max": float(d.abs().max()) if d.numel() else 0.0,
        "k1_sum": float((-d).sum()),
        "k3_sum": float((torch.exp(d) - d - 1.0).sum()),
        "beyond": float((d.abs() > threshold).sum()),
    }


def finish_mismatch(s: dict) -> dict:
    """Turn :func:`mismatch_stats` sums into the reported means."""
    n = max(s["n"], 1.0)
    return {
        "mismatch_mean_abs": s["abs_sum"] / n,
        "mismatch_max_abs": s["abs_max"],
        "mismatch_kl_k1": s["k1_sum"] / n,
        "mismatch_kl_k3": s["k3_sum"] / n,
        "mismatch_frac_beyond": s["beyond"] / n,
    }


def tis_weights(logp_old: torch.Tensor, logp_engine: torch.Tensor, cap: float) -> torch.Tensor:
    """min(pi_old / pi_engine, C) per token, without gradient."""
    return torch.exp(logp_old - logp_engine).clamp(max=cap).detach()


def mis_token_mask(logp_old: torch.Tensor, logp_engine: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """1.0 where lo <= pi_old / pi_engine <= hi, else 0.0 (token-level MIS)."""
    rho = torch.exp(logp_old - logp_engine)
    return ((rho >= lo) & (rho <= hi)).float()


def mis_sequence_keep(log_rho: torch.Tensor, paths: torch.Tensor, trainable: torch.Tensor,
                      lo: float, hi: float) -> torch.Tensor:
    """Keep fraction per token (N,) for sequence-level MIS on one tree.

    log_rho: (N,) log pi_old - log pi_engine, 0 on context; paths: (P, N) bool, path p holds
    token i; trainable: (N,) bool. A path with no trainable token is kept.
    """
    P = paths.double() * trainable.double()  # (P, N) trainable tokens of each path
    T = P.sum(1)  # (P,)
    mean_log_rho = (P @ log_rho.double()) / T.clamp(min=1.0)  # (P,)
    rho = torch.exp(mean_log_rho)
    kept = ((rho >= lo) & (rho <= hi)) | (T == 0)  # (P,)
    share = P / T.clamp(min=1.0)[:, None]  # (P, N) each path's 1/T_p share of a token
    total = share.sum(0)
    keep = (share * kept.double()[:, None]).sum(0) / total.clamp(min=1e-300)
    return torch.where(total > 0, keep, torch.ones_like(keep)).to(log_rho.dtype)
