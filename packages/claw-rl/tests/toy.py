"""A toy verifiable task for the learning tests: emit tokens from an allowed set.

The policy (the tiny model) is sampled directly with torch at temperature 1, recording the
logprobs of the sampled tokens as an engine would. Reward of a completion = the fraction of
its tokens that lie in the allowed set (ids below ``vocab // 10``): about 0.1 for the random
model, 1.0 when learned. GRPO samples put a whole group (one prompt, G completions) in one
tree-packed sample: the prompt once, G branches.
"""

from __future__ import annotations

import torch


def allowed(ids: torch.Tensor, vocab: int) -> torch.Tensor:
    return (ids < vocab // 10).float()


@torch.no_grad()
def sample_group(model, prompt: list[int], G: int, T: int, gen: torch.Generator):
    """G completions of T tokens: (ids (G, T), logprobs (G, T))."""
    x = torch.tensor([prompt] * G)
    ids, lps = [], []
    for _ in range(T):
        logits = model(input_ids=x).logits[:, -1].float()
        logp = torch.log_softmax(logits, -1)
        tok = torch.multinomial(logp.exp(), 1, generator=gen)  # (G, 1)
        ids.append(tok[:, 0])
        lps.append(logp.gather(-1, tok)[:, 0])
        x = torch.cat([x, tok], 1)
    return torch.stack(ids, 1), torch.stack(lps, 1)


def group_sample(
    sample_id: str,
    prompt: list[int],
    ids: torch.Tensor,
    lps: torch.Tensor,
    adv: torch.Tensor,
    n_traj_total: int,
    version: int,
) -> dict:
    """One claw.sample/v1 dict: the prompt once, then each completion as a branch."""
    P = len(prompt)
    G, T = ids.shape
    input_ids, parent, pos, trainable, logprobs, advantages, weights, versions = (
        list(prompt),
        [-1, *range(P - 1)],
        list(range(P)),
        [0] * P,
        [0.0] * P,
        [0.0] * P,
        [0.0] * P,
        [-1] * P,
    )
    for g in range(G):
        prev = P - 1
        for t in range(T):
            input_ids.append(int(ids[g, t]))
            parent.append(prev)
            prev = len(input_ids) - 1
            pos.append(P + t)
            trainable.append(1)
            logprobs.append(float(lps[g, t]))
            advantages.append(float(adv[g]))
            weights.append(1.0 / (n_traj_total * T))
            versions.append(version)
    return {
        "schema": "claw.sample/v1",
        "sample_id": sample_id,
        "algo": "grpo",
        "input_ids": input_ids,
        "position_ids": pos,
        "parent": parent,
        "trainable": trainable,
        "logprobs": logprobs,
        "advantages": advantages,
        "loss_weights": weights,
        "policy_versions": versions,
        "n_paths": G,
    }


def grpo_advantages(r: torch.Tensor) -> torch.Tensor:
    """(r - mean) / (std + eps) within a group (GRPO, Shao et al. 2024)."""
    return (r - r.mean()) / (r.std() + 1e-4)


def chain_ppo_sample(
    sample_id: str,
    prompt: list[int],
    ids: torch.Tensor,
    lps: torch.Tensor,
    values: list[float] | None,
    rewards: torch.Tensor,
    n_traj_total: int,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> dict:
    """A single-path PPO sample with GAE (Schulman et al. 2016) over per-token rewards.

    ``values`` are the critic's V(s_i) aligned with the packed tokens (from ``values()``), or
    None on the first pass (then advantages/returns are placeholders to be refilled).
    """
    P, T = len(prompt), ids.shape[0]
    n = P + T
    row = {
        "schema": "claw.sample/v1",
        "sample_id": sample_id,
        "algo": "ppo",
        "input_ids": list(prompt) + ids.tolist(),
        "position_ids": list(range(n)),
        "parent": list(range(-1, n - 1)),
        "trainable": [0] * P + [1] * T,
        "logprobs": [0.0] * P + lps.tolist(),
        "advantages": [0.0] * n,
        "returns": [0.0] * n,
        "loss_weights": [0.0] * P + [1.0 / (n_traj_total * T)] * T,
    }
    if values is not None:
        v = values[P:]
        adv, last = [0.0] * T, 0.0
        for t in reversed(range(T)):
            v_next = v[t + 1] if t + 1 < T else 0.0
            delta = float(rewards[t]) + gamma * v_next - v[t]
            last = delta + gamma * lam * last
            adv[t] = last
        row["advantages"] = [0.0] * P + adv
        row["returns"] = [0.0] * P + [a + b for a, b in zip(adv, v, strict=True)]
    return row
