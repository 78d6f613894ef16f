"""Top-k / top-p kept sets are decided once per learner step and replayed: a near-tie at a set's
edge cannot flip between passes or layouts (issue 40), and without a tie replay changes nothing.

Layout round-off is planted: a hook on the LM head moves the top logit of every row by
``DELTA`` in packed passes only (more rows than one sample has), as another padding or packing
layout moves logits by round-off; each sample's last token is the third most likely one, with a
``top_p`` between the two layouts' mass above the second most likely one."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from claw_rl import GRPOConfig, Learner
from claw_rl import learner as learner_mod
from claw_rl.forward import (
    _dropped,
    backbone_hidden,
    sampling_log_softmax,
    sampling_log_softmax_kept,
    token_logprobs,
)
from claw_rl.learner import load_policy
from claw_rl.packing import pack
from claw_rl.records import Sample
from rl_testlib import tree_sample

DELTA = 1e-6  # logit shift of a packed pass: a few float32 ulps of the boundary's mass


@contextlib.contextmanager
def packed_round_off(model: torch.nn.Module, single_rows: int):
    """LM-head outputs of passes with more than ``single_rows`` rows get their top logit + DELTA."""

    def hook(_mod, _args, out):
        if out.shape[0] <= single_rows:
            return out
        top = out.detach().argmax(-1)
        shift = torch.zeros_like(out)
        shift[torch.arange(out.shape[0]), top] = DELTA
        return out + shift

    handle = model.get_output_embeddings().register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def _mass_above(z: torch.Tensor, rank: int) -> float:
    """The float32 mass ranked strictly above the ``rank``-th largest of ``z`` (V,), as _dropped
    computes it."""
    sv, _ = torch.sort(z, descending=True)
    sp = torch.softmax(sv, -1)
    return float((torch.cumsum(sp, -1) - sp)[rank])


def _planted_samples(model: torch.nn.Module, n_samples: int = 3) -> list[Sample]:
    """Chains whose last token is the 3rd most likely at top_p between the unshifted and the
    shifted mass above the 2nd: the packed pass drops the 2nd, a single-sample pass keeps it."""
    vocab = model.config.vocab_size
    out = []
    for k in range(n_samples):
        parent = list(range(-1, 7))
        trainable = [0, 0, 1, 1, 1, 1, 1, 1]
        row = tree_sample(parent, trainable, seed=40 + k, sample_id=f"tie{k}", vocab=vocab)
        with torch.no_grad():
            z = model(input_ids=torch.tensor([row["input_ids"][:-1]])).logits[0, -1].float()
        order = torch.argsort(z, descending=True)
        row["input_ids"][-1] = int(order[2])
        shifted = z.clone()
        shifted[order[0]] += DELTA
        lo, hi = _mass_above(z, 1), _mass_above(shifted, 1)
        assert hi - lo > 4 * np.spacing(np.float32(hi)), (lo, hi)  # the plant is resolvable
        top_p = float(np.float32((lo + hi) / 2))
        assert lo < top_p < hi
        row["temperatures"] = [1.0] * len(parent)
        row["top_ps"] = [1.0] * (len(parent) - 1) + [top_p]
        row["top_ks"] = [0] * len(parent)
        row["advantages"] = [0.0, 0.0, 1.0, -1.0, 0.5, -0.5, 1.0, 1.0]
        out.append(Sample.from_dict(row))
    return out


class _Recorder:
    """The learner's objective, recording each training pass's ratio pi_theta / pi_old."""

    def __init__(self, inner):
        self.inner = inner
        self.ratios: list[torch.Tensor] = []

    @property
    def at_sampling_settings(self) -> bool:
        return self.inner.at_sampling_settings

    def __call__(self, lp, old, A, agg, tok):
        self.ratios.append(torch.exp(lp.detach() - old["logp_old"]))
        return self.inner(lp, old, A, agg, tok)


def _first_update_ratios(tiny, samples, replay: bool, monkeypatch) -> torch.Tensor:
    """Ratios of the first update: phase 1 packs every sample into one (shifted) pass, the
    minibatches forward one sample each (unshifted)."""
    cfg = GRPOConfig(lr=1e-3, micro_batch_size=4, minibatches=len(samples), epochs=1)
    learner = Learner.grpo(cfg, tiny)
    if not replay:  # today's main: every pass decides the kept sets again
        fresh = token_logprobs
        monkeypatch.setattr(
            learner_mod,
            "token_logprobs",
            lambda *a, kept=None, **kw: fresh(*a, **kw),
        )
    rec = _Recorder(learner.objective)
    learner.objective = rec
    with packed_round_off(learner.policy, single_rows=6):
        learner.step([s.to_dict() for s in samples])
    monkeypatch.undo()
    return rec.ratios[0]


def test_near_tie_ratio_is_one_with_replay(tiny, monkeypatch):
    """Planted near-tie: the first update's on-policy ratio is 1 to round-off with replay; deciding
    the set again in the training pass (today's main) moves the last token's ratio by > 10 %."""
    samples = _planted_samples(load_policy(tiny, torch.float32))
    on = _first_update_ratios(tiny, samples, replay=True, monkeypatch=monkeypatch)
    off = _first_update_ratios(tiny, samples, replay=False, monkeypatch=monkeypatch)
    gap_on = float((on - 1).abs().max())
    gap_off = float((off - 1).abs().max())
    assert gap_on <= 10 * DELTA, gap_on
    assert gap_off > 0.1, gap_off  # the planted tie flips without replay
    assert abs(float(off[-1]) - 1) == pytest.approx(gap_off)  # ... at the planted token


def _loss(model, samples: list[Sample], kept: torch.Tensor | None) -> torch.Tensor:
    """sum_i A_i log pi_i over ``samples`` in one packed pass, ``kept`` in predictor order."""
    batch = pack(samples)
    b, i, _ = batch.predictor_index()
    st = token_logprobs(model, backbone_hidden(model, batch), batch, kept=kept)
    return (st.logprobs.double() * batch.advantages[b, i].double()).sum()


@torch.no_grad()
def test_packed_and_split_layouts_agree_once_kept_sets_are_decided(tiny):
    """The planted near-tie: with the kept sets decided once (here by the packed pass), one
    packed pass and one pass per sample give the same loss to round-off; deciding them in each
    layout gives losses that differ by the flipped token's probability."""
    model = load_policy(tiny, torch.float32)
    samples = _planted_samples(model)
    with packed_round_off(model, single_rows=6):
        batch = pack(samples)
        st = token_logprobs(model, backbone_hidden(model, batch), batch)
        kept = st.kept
        per = list(torch.split(kept, batch.trainable.sum(1).tolist()))
        packed = _loss(model, samples, kept)
        split = sum(_loss(model, [s], k) for s, k in zip(samples, per, strict=True))
        packed_fresh = _loss(model, samples, None)
        split_fresh = sum(_loss(model, [s], None) for s in samples)
    assert (kept >= 0).sum() == len(samples) and (kept[kept >= 0] == 1).all()  # 1 besides it
    assert float(abs(packed - split)) <= 10 * DELTA, float(abs(packed - split))
    assert float(abs(packed_fresh - packed)) <= 1e-12  # the deciding pass is the replayed one
    assert float(abs(packed_fresh - split_fresh)) > 0.1  # layouts disagree without replay


def test_replayed_logprobs_equal_fresh_ones_without_ties():
    """Random logits and settings (greedy, top_k, top_p, both, neither): replaying the kept counts
    gives bit-identical log-probabilities and sets; the counts are those of _dropped."""
    gen = torch.Generator().manual_seed(40)
    for trial in range(20):
        m, V = 300, 64 + trial
        logits = torch.randn(m, V, generator=gen) * (0.5 + trial / 5)
        T = torch.rand(m, generator=gen) * 1.5 + 0.1
        T[torch.rand(m, generator=gen) < 0.1] = 0.0
        top_p = torch.where(
            torch.rand(m, generator=gen) < 0.6, torch.rand(m, generator=gen), torch.ones(m)
        )
        top_k = torch.where(
            torch.rand(m, generator=gen) < 0.5, torch.randint(0, V + 5, (m,), generator=gen), 0
        )
        targets = torch.randint(0, V, (m,), generator=gen)
        fresh, kept = sampling_log_softmax_kept(logits, T, top_p, top_k, targets)
        again, same = sampling_log_softmax_kept(logits, T, top_p, top_k, targets, kept)
        assert torch.equal(fresh, again) and torch.equal(kept, same)
        assert torch.equal(fresh, sampling_log_softmax(logits, T, top_p, top_k, targets))
        greedy = T <= 0
        z = logits / torch.where(greedy, torch.ones_like(T), T)[:, None]
        drop = _dropped(
            z, torch.where(greedy, 1.0, top_p), torch.where(greedy, 0, top_k)
        )  # the sets before the target is added
        off = greedy | ((top_p >= 1) & ((top_k <= 0) | (top_k >= V)))
        t_in = ~drop[torch.arange(m), targets]
        assert torch.equal(kept[off], torch.full_like(kept[off], -1))
        assert torch.equal(kept[~off], ((~drop).sum(-1) - t_in.long())[~off])
        assert bool((kept[~off] < V - 1).any())  # some rows were truncated


def test_replay_is_continuous_at_a_planted_near_tie():
    """Two logits 1e-7 apart at a top_k = 2 edge, the target one of them: deciding the set in
    each of two passes whose logits swap the pair moves the logprob by the other one's share,
    replaying the first pass's count moves it by round-off."""
    z = torch.tensor([[3.0, 1.0, 1.0 + 1e-7, 0.0, -1.0]], dtype=torch.float64)
    swapped = z.clone()
    swapped[0, 2] -= 2e-7  # round-off of another layout: the pair swaps ranks
    T, p, k, t = torch.ones(1), torch.ones(1), torch.tensor([2]), torch.tensor([1])
    first, kept = sampling_log_softmax_kept(z, T.double(), p.double(), k, t)
    fresh = sampling_log_softmax_kept(swapped, T.double(), p.double(), k, t)[0]
    replay = sampling_log_softmax_kept(swapped, T.double(), p.double(), k, t, kept)[0]
    assert int(kept[0]) == 2  # first pass: the target 3rd, forced in besides the top 2
    assert abs(float(fresh[0, 1] - first[0, 1])) > 0.05
    assert abs(float(replay[0, 1] - first[0, 1])) <= 1e-6
    with pytest.raises(ValueError, match="kept counts"):
        sampling_log_softmax_kept(z, T.double(), p.double(), k, t, torch.tensor([1, 1]))


def _weights_after(tiny, rows: list[dict], replay: bool, monkeypatch) -> tuple[float, list]:
    cfg = GRPOConfig(
        lr=1e-3, micro_batch_size=2, minibatches=2, epochs=2, entropy_coef=0.01, kl_coef=0.1
    )
    learner = Learner.grpo(cfg, tiny)
    if not replay:
        fresh = token_logprobs
        monkeypatch.setattr(
            learner_mod, "token_logprobs", lambda *a, kept=None, **kw: fresh(*a, **kw)
        )
    loss = learner.step(rows)["loss"]
    monkeypatch.undo()
    return loss, [p.detach().clone() for p in learner.params()]


def test_untruncated_run_is_bit_identical_to_deciding_afresh(tiny, monkeypatch):
    """Without top_k / top_p nothing is replayed: epochs x minibatches with entropy and KL terms
    give the same loss and weight bits as passes that decide every set afresh (today's main)."""
    vocab = load_policy(tiny, torch.float32).config.vocab_size
    rows = [
        tree_sample([-1, 0, 1, 2, 2, 4, 3], [0, 1, 1, 1, 1, 1, 1], seed=k, sample_id=f"d{k}",
                    vocab=vocab)
        for k in range(4)
    ]  # fmt: skip
    for row in rows:
        row["temperatures"] = [0.7] * len(row["parent"])  # not truncated at T != 1 either
    loss_on, w_on = _weights_after(tiny, rows, True, monkeypatch)
    loss_off, w_off = _weights_after(tiny, rows, False, monkeypatch)
    assert loss_on == loss_off and loss_on != 0.0  # a real update, the same bits
    assert all(torch.equal(a, b) for a, b in zip(w_on, w_off, strict=True))


def test_engine_sets_hold_in_every_pass_and_layout(tiny, monkeypatch):
    """Samples carrying the engine's sets (test_kept_engine's plant: phase 1 packed and shifted,
    the training passes one sample each and unshifted): the first update's ratio is 1 to
    round-off even with the replay of phase 1's counts switched off, since every pass takes the
    engine's size; without the record (and without replay) the planted token's ratio jumps."""
    from test_kept_engine import _planted, _without_kept

    rows, _ = _planted(load_policy(tiny, torch.float32))
    samples = [Sample.from_dict(r) for r in rows]
    bare = [Sample.from_dict(r) for r in _without_kept(rows)]
    recorded = _first_update_ratios(tiny, samples, replay=False, monkeypatch=monkeypatch)
    replayed = _first_update_ratios(tiny, samples, replay=True, monkeypatch=monkeypatch)
    fresh = _first_update_ratios(tiny, bare, replay=False, monkeypatch=monkeypatch)
    assert float((recorded - 1).abs().max()) <= 10 * DELTA
    assert float((replayed - 1).abs().max()) <= 10 * DELTA
    assert float((fresh - 1).abs().max()) > 0.1


def test_no_recorded_sets_is_bit_identical_to_no_field(tiny, monkeypatch):
    """A `kept` of all -1 (no token recorded) on truncated near-tie samples gives the same loss
    and weight bits as the same samples without the field, over epochs x minibatches with
    entropy and KL terms: tokens without a record are decided exactly as before."""
    samples = _planted_samples(load_policy(tiny, torch.float32), n_samples=4)
    rows = [s.to_dict() for s in samples]
    minus = [{**r, "kept": [-1] * len(r["input_ids"])} for r in rows]
    loss_a, w_a = _weights_after(tiny, rows, True, monkeypatch)
    loss_b, w_b = _weights_after(tiny, minus, True, monkeypatch)
    assert loss_a == loss_b and loss_a != 0.0
    assert all(torch.equal(a, b) for a, b in zip(w_a, w_b, strict=True))
