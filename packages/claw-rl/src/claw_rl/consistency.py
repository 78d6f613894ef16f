"""Training-inference consistency: how far the learner's logprobs are from the engine's, and
importance weights that correct for it.

The engine (vLLM, claw-proxy's transformers engine) samples from pi_engine, which differs from
the learner's pi_old by kernels, precision and batching. The policy gradient estimated on
engine samples is corrected by rho = pi_old / pi_engine per token:

* :func:`tis_weights` - truncated importance sampling, min(rho, C) (Yao et al. 2025, "Your
  efficient RL framework secretly brings you off-policy RL training").
* :func:`mis_token_mask` - masked importance sampling: drop tokens with rho outside [lo, hi]
  (Liu et al. 2025, "When speed kills stability"; token level).
* :func:`mis_sequence_keep` - the same on whole trajectories: a path is dropped when the
  geometric mean of its per-token rho leaves [exp(-tol), exp(tol)]. On a tree a token shared by
  kept and dropped paths keeps the kept paths' share of its weight (:func:`path_shares`).

The band of sequence MIS. The geometric mean is exp(mean_t log rho_t), and on engine samples
E[log rho_t] = -KL(pi_engine || pi_old) per token, about -1e-3 for a healthy bf16 engine; its
noise shrinks as 1/sqrt(T). The token band [0.5, 2] on this mean (|mean log rho| <= 0.69) is
practically never left, so sequence MIS has its own tolerance, default 0.01 (the band
[0.990, 1.010], the range verl's geometric rejection sampling is run with): it drops a path
whose tokens drift by more than 1 % per token on average, which a healthy path of a hundred
tokens or more does not do, and a path sampled from another policy (a stale or broken engine)
does.

An MoE policy's routing is made consistent too (R3 / R2: claw_rl._moe, forward.moe_hidden); the
models beside it that forward the same tokens - the reference of the KL penalty, a separate critic
backbone - replay the experts the policy's pass used when they share its layout
(:func:`replays_policy_routing`): a token's experts are a property of the sample.
"""

from __future__ import annotations

import logging

import torch

from claw_rl import _moe

log = logging.getLogger("claw_rl")


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


def mis_token_mask(
    logp_old: torch.Tensor, logp_engine: torch.Tensor, lo: float, hi: float
) -> torch.Tensor:
    """1.0 where lo <= pi_old / pi_engine <= hi, else 0.0 (token-level MIS)."""
    rho = torch.exp(logp_old - logp_engine)
    return ((rho >= lo) & (rho <= hi)).float()


def path_shares(paths: torch.Tensor, trainable: torch.Tensor, kind: str) -> torch.Tensor:
    """u_p (P,): the share of a token's weight that path p holds, up to a per-token constant.

    The packed loss weight of token i is w_i = sum_p u_{p,i}; sequence MIS keeps the kept paths'
    part of it. ``kind="equal"``: u_p = 1 (every path through a token holds the same share: the
    count-based aggregators, and claw-tree's ``token`` weighting, where w_i is split equally over
    its paths). ``kind="inverse_length"``: u_p = 1 / T_p (claw-tree's ``rollout`` and ``path``
    weightings, w_i = sum_p W_p / T_p with W_p equal for the paths of one rollout).
    paths: (P, N) bool; trainable: (N,) bool.
    """
    if kind == "equal":
        return torch.ones(paths.shape[0], dtype=torch.float64)
    if kind == "inverse_length":
        T = (paths & trainable[None, :]).double().sum(1)
        return 1.0 / T.clamp(min=1.0)
    raise ValueError(f"path_shares: kind must be 'equal' or 'inverse_length', got {kind!r}")


def mis_sequence_keep(
    log_rho: torch.Tensor,
    paths: torch.Tensor,
    trainable: torch.Tensor,
    tol: float,
    shares: torch.Tensor,
) -> torch.Tensor:
    """Keep fraction per token (N,) for sequence-level MIS on one tree.

    Path p is kept iff |mean_{t in p, trainable} log rho_t| <= tol, i.e. its geometric-mean rho
    lies in [exp(-tol), exp(tol)] (Liu et al. 2025, sequence-level masking; the geometric mean
    as in Zheng et al. 2025, GSPO). keep_i = sum_{p kept, p holds i} u_p / sum_{p holds i} u_p,
    so that sum_i w_i keep_i l_i equals the flat per-path loss with the dropped paths removed.

    log_rho: (N,) log pi_old - log pi_engine, 0 on context; paths: (P, N) bool, path p holds
    token i; trainable: (N,) bool; shares: (P,) u_p from :func:`path_shares`. A path with no
    trainable token is kept.
    """
    P = paths.double() * trainable.double()  # (P, N) trainable tokens of each path
    T = P.sum(1)  # (P,)
    mean_log_rho = (P @ log_rho.double()) / T.clamp(min=1.0)  # (P,)
    kept = (mean_log_rho.abs() <= tol) | (T == 0)  # (P,)
    share = P * shares.double()[:, None]  # (P, N)
    total = share.sum(0)
    keep = (share * kept.double()[:, None]).sum(0) / total.clamp(min=1e-300)
    return torch.where(total > 0, keep, torch.ones_like(keep)).to(log_rho.dtype)


def replays_policy_routing(
    model: torch.nn.Module, policy_routers: list[torch.nn.Module], what: str
) -> bool:
    """Whether ``model`` (the reference, a critic backbone) can replay the routing of the
    policy whose MoE routers are ``policy_routers``: both MoE, with the same number of MoE
    layers L, top-k K and experts E. An MoE model of another layout cannot: it routes live, and
    a warning (once, here) says so; a dense model has nothing to route."""
    routers = _moe.moe_routers(model)
    if not routers or not policy_routers:
        return False

    def layout(rs: list[torch.nn.Module]) -> tuple[int, int, int]:
        return len(rs), int(rs[0].top_k), int(rs[0].num_experts)

    mine, policy = layout(routers), layout(policy_routers)
    if mine != policy:
        log.warning(
            "claw-rl: the %s has %d MoE layers x top %d of %d experts, the policy %d x top %d "
            "of %d: it cannot replay the policy's routing and routes its own experts live",
            what, *mine, *policy,
        )  # fmt: skip
        return False
    return True
