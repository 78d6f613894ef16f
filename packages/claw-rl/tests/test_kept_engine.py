"""The engine's kept sets (claw.sample/v1 ``kept``, from the call's ``completion_kept``): the
learner's first pass takes the size the engine sampled with instead of deciding one, so a
near-tie at the set's edge cannot make the learner's set differ from the engine's (issue 40).

The engine's numerics are planted: its logits are the learner's with the top logit moved by
``DELTA`` (round-off of another kernel / dtype); the last token of each sample is the 2nd most
likely one, at a ``top_p`` between the two versions' mass above the 3rd: the engine drops the
3rd (kept size 1), the learner's own logits would keep it (size 2)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from claw_rl import GRPOConfig, Learner
from claw_rl.errors import RecordError
from claw_rl.forward import backbone_hidden, sampling_log_softmax_kept, token_logprobs
from claw_rl.learner import load_policy
from claw_rl.packing import keep_sessions, pack
from claw_rl.records import Sample
from rl_testlib import tree_sample

DELTA = 1e-6  # the engine's top logit minus the learner's: a few float32 ulps of the edge's mass


def _mass_above(z: torch.Tensor, rank: int) -> float:
    """The float32 mass ranked strictly above the ``rank``-th largest of ``z`` (V,), as the
    engine and the learner's _dropped compute it."""
    sv, _ = torch.sort(z, descending=True)
    sp = torch.softmax(sv, -1)
    return float((torch.cumsum(sp, -1) - sp)[rank])


def _engine_logprob(z_e: torch.Tensor, target: int, top_p: float) -> tuple[float, int]:
    """By hand, in float64: the engine's logprob of ``target`` under its top_p set of its logits
    ``z_e`` (a token is kept while the mass ranked above it is < top_p), and the set's size less
    the target."""
    p = torch.softmax(z_e.double(), -1)
    order = torch.argsort(z_e, descending=True).tolist()
    above, kept = 0.0, []
    for tok in order:
        if above >= top_p:
            break
        kept.append(tok)
        above += float(p[tok])
    assert target in kept
    return float(z_e[target].double() - torch.logsumexp(z_e.double()[kept], 0)), len(kept) - 1


def _by_size(z: torch.Tensor, target: int, size: int) -> float:
    """By hand: log pi(target) over the target and the ``size`` largest other logits of z."""
    others = [t for t in torch.argsort(z, descending=True).tolist() if t != target][:size]
    return float(z[target].double() - torch.logsumexp(z.double()[[target, *others]], 0))


def _planted(model, n_samples: int = 2) -> tuple[list[dict], list[dict]]:
    """(rows, facts): chains whose last token is the 2nd most likely, top_p between the
    learner's and the engine's mass above the 3rd; the row's logprob there is the engine's (by
    hand), the other trainable tokens' logprobs the learner's own (so only the plant mismatches);
    ``kept`` is -1 but for the last token (the engine's size)."""
    vocab = model.config.vocab_size
    rows, facts = [], []
    for k in range(n_samples):
        parent = list(range(-1, 7))
        row = tree_sample(parent, [0, 0, 1, 1, 1, 1, 1, 1], seed=70 + k, sample_id=f"e{k}",
                          vocab=vocab)  # fmt: skip
        ids = torch.tensor([row["input_ids"]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float()
        z = logits[-2]  # predicts the last token
        order = torch.argsort(z, descending=True)
        row["input_ids"][-1] = target = int(order[1])
        z_e = z.clone()
        z_e[order[0]] += DELTA
        lo, hi = _mass_above(z, 2), _mass_above(z_e, 2)
        assert hi - lo > 4 * np.spacing(np.float32(hi)), (lo, hi)  # the plant is resolvable
        top_p = float(np.float32((lo + hi) / 2))
        assert lo < top_p < hi
        lp_engine, size = _engine_logprob(z_e, target, top_p)
        own = torch.log_softmax(logits[1:-1].double(), -1)  # untruncated tokens 2 .. 6
        row["logprobs"] = [0.0, 0.0] + [float(own[j, row["input_ids"][j + 2]]) for j in range(5)]
        row["logprobs"].append(lp_engine)
        row["top_ps"] = [1.0] * 7 + [top_p]
        row["kept"] = [-1] * 7 + [size]
        rows.append(row)
        facts.append({"size": size, "engine": lp_engine, "by_size": _by_size(z, target, size),
                      "own": _by_size(z, target, size + 1)})  # fmt: skip
    return rows, facts


def _without_kept(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "kept"} for r in rows]


def test_learner_takes_the_engines_set_at_a_planted_near_tie(tiny):
    """The pi_old pass uses the engine's size 1 where its own logits give 2: the last token's
    logprob is the hand-computed one over the target and 1 other logit, and matches the engine's
    recorded logprob to round-off; without the record it is over 2 others, a jump of the 3rd
    token's share (> 0.1 nats here)."""
    learner = Learner.grpo(GRPOConfig(lr=1e-3, micro_batch_size=4), tiny)
    rows, facts = _planted(learner.policy)
    with_rec = learner.logprobs(rows)
    without = learner.logprobs(_without_kept(rows))
    for got, bare, f in zip(with_rec, without, facts, strict=True):
        assert f["size"] == 1
        assert got[-1] == pytest.approx(f["by_size"], abs=1e-5)
        assert abs(got[-1] - f["engine"]) <= 1e-5  # float round-off (DELTA-sized)
        assert bare[-1] == pytest.approx(f["own"], abs=1e-5)  # its own set: 2 others
        assert abs(bare[-1] - f["engine"]) > 0.1  # the 3rd token's probability jump
        assert got[:-1] == bare[:-1]  # unrecorded tokens: decided as before, same bits


def test_mismatch_metrics_see_round_off_with_the_record(tiny):
    """Learner.step's engine-vs-learner mismatch (phase 1) is round-off when the samples carry
    the engine's sets, the planted jump without them."""
    model = load_policy(tiny, torch.float32)
    rows, facts = _planted(model)
    on = Learner.grpo(GRPOConfig(lr=1e-3, micro_batch_size=4), tiny).step(rows)
    off = Learner.grpo(GRPOConfig(lr=1e-3, micro_batch_size=4), tiny).step(_without_kept(rows))
    jump = max(abs(f["own"] - f["engine"]) for f in facts)
    assert on["mismatch_max_abs"] <= 1e-5, on["mismatch_max_abs"]
    assert off["mismatch_max_abs"] == pytest.approx(jump, rel=1e-3)


@torch.no_grad()
def test_first_pass_returns_the_engines_sizes_for_later_passes(tiny):
    """token_logprobs' kept counts (replayed by every later pass) hold the engine's size where
    recorded, its own decision elsewhere (-1 on untruncated tokens); replaying them on the same
    logits gives the same bits."""
    model = load_policy(tiny, torch.float32)
    rows, facts = _planted(model)
    batch = pack([Sample.from_dict(r) for r in rows])
    assert batch.kept is not None and batch.kept.shape == batch.input_ids.shape
    hidden = backbone_hidden(model, batch)
    st = token_logprobs(model, hidden, batch)
    want = [k for f in facts for k in [-1] * 5 + [f["size"]]]  # 6 trainable tokens a sample
    assert st.kept.tolist() == want
    again = token_logprobs(model, hidden, batch, kept=st.kept)
    assert torch.equal(again.logprobs, st.logprobs)


def test_engine_sizes_equal_to_the_learners_change_nothing():
    """Random logits and settings without ties: engine sizes equal to the learner's own
    decisions give bit-identical logprobs; -1 rows and rows that are not truncated (greedy, no
    top_k / top_p) are decided as without them; a recorded size is kept as given."""
    gen = torch.Generator().manual_seed(41)
    for trial in range(10):
        m, V = 200, 50 + trial
        logits = torch.randn(m, V, generator=gen)
        T = torch.rand(m, generator=gen) + 0.2
        T[:10] = 0.0
        top_p = torch.where(torch.rand(m, generator=gen) < 0.6, torch.rand(m, generator=gen), 1.0)
        top_k = torch.where(
            torch.rand(m, generator=gen) < 0.5, torch.randint(1, V, (m,), generator=gen), 0
        )
        targets = torch.randint(0, V, (m,), generator=gen)
        fresh, kept = sampling_log_softmax_kept(logits, T, top_p, top_k, targets)
        engine = torch.where(torch.rand(m, generator=gen) < 0.5, kept, -1)
        engine[:10] = 3  # greedy rows: no distribution, the record is ignored
        got, got_kept = sampling_log_softmax_kept(logits, T, top_p, top_k, targets, None, engine)
        assert torch.equal(got, fresh) and torch.equal(got_kept, kept)
        other = torch.where(kept >= 0, (kept + 1).clamp(max=V - 1), -1)
        _, forced = sampling_log_softmax_kept(logits, T, top_p, top_k, targets, None, other)
        assert torch.equal(forced, other) and bool((kept >= 0).any())


def test_sample_kept_is_read_strictly_and_packed():
    """Sample.from_dict reads kept (ints >= -1, one per token; errors name the field), writes
    it back, keep_sessions cuts it; pack gives Batch.kept (-1 padding), None without any."""
    row = tree_sample([-1, 0, 1, 2], [0, 1, 1, 1], sample_id="k", vocab=50)
    s = Sample.from_dict({**row, "kept": [-1, 4, -1, 0]})
    assert s.kept == (-1, 4, -1, 0) and s.to_dict()["kept"] == [-1, 4, -1, 0]
    assert "kept" not in Sample.from_dict(row).to_dict()
    for bad, error in (
        ([-1, 4, -1], "field 'kept' has 3 entries"),
        ([-1, -2, -1, 0], "field 'kept'[1] = -2 must be >= -1"),
        ([-1, 1.0, -1, 0], "field 'kept'[1] must be a integer"),
        ([-1, True, -1, 0], "field 'kept'[1] must be a integer"),
    ):
        with pytest.raises(RecordError) as err:
            Sample.from_dict({**row, "kept": bad}, where="samples.jsonl:3")
        assert error in str(err.value) and "samples.jsonl:3" in str(err.value), str(err.value)
    short = Sample.from_dict(tree_sample([-1, 0], [0, 1], sample_id="j", vocab=50))
    batch = pack([s, short])
    assert batch.kept is not None and batch.kept.tolist() == [[-1, 4, -1, 0], [-1, -1, -1, -1]]
    assert pack([short]).kept is None
    two = Sample.from_dict(
        {**tree_sample([-1, 0, -1, 2], [0, 1, 0, 1], sample_id="t", vocab=50),
         "kept": [-1, 5, -1, 6], "sessions": ["a", "b"],
         "tags": {"session_offsets": [0, 2]}}
    )  # fmt: skip
    assert keep_sessions(two, [False, True]).kept == (-1, 6)


def test_hand_reference_helpers_agree_with_the_engine_rule():
    """The hand-computed engine logprob (float64 loop) equals claw-proxy's rule written with
    torch ops on a small example: top_p 0.6 over probabilities 0.5, 0.3, 0.2 keeps two."""
    z = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    lp, size = _engine_logprob(z, 1, 0.6)
    assert size == 1 and lp == pytest.approx(math.log(0.3 / 0.8))
    assert _by_size(z, 1, 1) == pytest.approx(math.log(0.3 / 0.8))
