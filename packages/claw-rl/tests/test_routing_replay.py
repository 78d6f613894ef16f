"""Rollout routing replay (R3, issue 40) through tree packing: an MoE policy's packed samples
train exactly like their flat per-path samples once every token goes to its recorded experts.

The tiny MoE (tests/fixtures/tiny-qwen3-moe: 2 MoE layers, hidden 128, 8 experts, top 2). The
recorded routing of a token is a function of its token prefix (:func:`prefix_routing`), as an
engine's would be: the same token in the same context has the same row in a tree sample, in each
of its flat paths, and in a group- or batch-packed sample.

Layout round-off is planted for the "without replay" checks: in each learner the router rows of
experts A and B are made equal (every token's two logits tie) and the tie is broken by
``DELTA`` towards B in the packed learner and towards A in the flat one, as another layout's
round-off would break it. Tokens whose K-th and (K+1)-th experts are A and B then go to
different experts in the two layouts without replay, and to the recorded ones with it.

Tolerance as in test_packed_gradients.py: packing changes only the fp32 summation order.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from claw_rl import GRPOConfig, Learner, PPOConfig, _tree_attention, packing
from claw_rl import learner as learner_mod
from claw_rl.packing import keep_sessions, pack
from claw_rl.records import Sample, append_routing
from rl_testlib import group_rollout, merge_group, tree_sample
from test_packed_gradients import _batch, _engine_logprobs, _flat, _grads

MOE = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "tiny-qwen3-moe"
TOL = 1e-5
L, K, E = 2, 2, 8
A, B = 3, 5  # the planted tie
DELTA = 1e-6


def prefix_routing(parent: list[int], input_ids: list[int]) -> np.ndarray:
    """(N, L, K) distinct experts per token and layer, a function of the token's prefix."""
    out = np.empty((len(parent), L, K), dtype=np.int16)
    key: list[tuple] = []
    for i, p in enumerate(parent):
        key.append((key[p] if p >= 0 else ()) + (input_ids[i],))
        rng = np.random.default_rng(zlib.crc32(np.asarray(key[-1], dtype=np.int64).tobytes()))
        out[i] = [rng.permutation(E)[:K] for _ in range(L)]
    return out


def with_routing(rows: list[dict], path: Path, unrecorded: float = 0.0) -> list[dict]:
    """``rows`` with their prefix routing appended to ``path`` (absolute references); a fraction
    ``unrecorded`` of the tokens (chosen by prefix too) gets -1 rows."""
    out = []
    for r in rows:
        a = prefix_routing(r["parent"], r["input_ids"])
        if unrecorded:
            a[(a[:, 0, 0] * 7 + a[:, 1, 1]) % 10 < 10 * unrecorded] = -1
        ref = append_routing(path, a, E)
        out.append({**r, "routing": {**ref, "file": str(path)}})
    return out


@contextlib.contextmanager
def planted_tie(learner: Learner, winner: int | None, single_rows: int = 0):
    """Router rows A and B equal in every MoE layer (computed from the same weights), the tie
    broken towards ``winner`` by DELTA on its logit; ``winner`` None: towards B in passes of more
    than ``single_rows`` tokens, towards A in the others (a packed pass against one sample's)."""
    originals = []
    for router in learner.routers:
        with torch.no_grad():
            router.weight[B] = router.weight[A]
        forward = router.forward

        def planted(hidden, _router=router):
            h = hidden.reshape(-1, _router.hidden_dim)
            logits = torch.nn.functional.linear(h, _router.weight)
            won = winner if winner is not None else (B if h.shape[0] > single_rows else A)
            logits = logits + torch.nn.functional.one_hot(torch.tensor(won), E) * DELTA
            probs = torch.softmax(logits, dtype=torch.float, dim=-1)
            top, idx = torch.topk(probs, _router.top_k, dim=-1)
            top = top / top.sum(-1, keepdim=True) if _router.norm_topk_prob else top
            return logits, top.to(logits.dtype), idx

        router.forward = planted
        originals.append((router, forward))
    try:
        yield
    finally:
        for router, forward in originals:
            router.forward = forward


def _moe_compare(make, cfg, tree_rows, flat_rows, plant: bool) -> tuple[float, float, dict, dict]:
    """(max |g_packed - g_flat|, |loss diff|, packed metrics, flat metrics) of one step each."""
    a, b = make(cfg, MOE), make(cfg, MOE)
    with contextlib.ExitStack() as stack:
        if plant:
            stack.enter_context(planted_tie(a, B))
            stack.enter_context(planted_tie(b, A))
        g_tree, m_tree = _grads(a, tree_rows)
        g_flat, m_flat = _grads(b, flat_rows)
    assert set(g_tree) == set(g_flat) and g_tree
    assert max(float(g.abs().max()) for g in g_flat.values()) > 1e-3  # not two zero gradients
    worst = max(float((g_tree[n] - g_flat[n]).abs().max()) for n in g_tree)
    return worst, abs(m_tree["loss"] - m_flat["loss"]), m_tree, m_flat


def _tree_and_flat(tmp_path, weighting: str, ppo: bool) -> tuple[list[dict], list[dict]]:
    """test_packed_gradients' two tree samples and their flat paths, with prefix routing and
    engine logprobs of the (unplanted) MoE policy."""
    learner = Learner.grpo(GRPOConfig(), MOE)
    samples = _batch(learner.policy.config.vocab_size, weighting, ppo)
    _engine_logprobs(learner, samples, seed=1)
    flat = _flat(samples)
    tree = [{k: v for k, v in s.items() if k != "_u"} for s in samples]
    return with_routing(tree, tmp_path / "tree.routing"), with_routing(
        flat, tmp_path / "flat.routing"
    )


LAYOUTS = ["dense", "tree"]


@pytest.fixture(params=LAYOUTS)
def layout(request, monkeypatch):
    """The packed learner's attention layout: the dense (B, 1, N, N) mask, or block-sparse tree
    attention (tokens in preorder: the routing is permuted with them)."""
    if request.param == "tree":
        monkeypatch.setattr(packing, "DENSE_MAX_TOKENS", 0)
        monkeypatch.setattr(_tree_attention, "_CPU_CHUNK", 64)
    return request.param


GRPO_WEIGHTINGS = [("weights", "token"), ("weights", "rollout"), ("token_mean", "token"),
                   ("constant", "token")]  # fmt: skip


@pytest.mark.parametrize(("agg", "weighting"), GRPO_WEIGHTINGS)
def test_grpo_moe_packed_gradient_equals_flat_with_replay(tmp_path, layout, agg, weighting):
    """GRPO on the tiny MoE with r3: packed and flat per-path loss and gradients agree to 1e-5
    in both layouts for every aggregation and path weighting, with a planted tie that routes
    them apart without replay."""
    tree, flat = _tree_and_flat(tmp_path, weighting, ppo=False)
    cfg = GRPOConfig(lr=1e-3, max_grad_norm=0.0, is_correction="tis", loss_agg=agg,
                     constant_len=8, entropy_coef=0.01)  # fmt: skip
    worst, dloss, m, _ = _moe_compare(Learner.grpo, cfg, tree, flat, plant=True)
    assert worst <= TOL and dloss <= 1e-6, f"{agg} {weighting} {layout}: {worst:.3g} {dloss:.3g}"
    assert m["routing_recorded_fraction"] == 1.0 and m["routing_flip_rate"] > 0.5


@pytest.mark.parametrize("weighting", ["token", "rollout"])
@pytest.mark.parametrize("center", [True, False], ids=["centred", "scaled"])
def test_ppo_moe_packed_gradient_equals_flat_with_replay(tmp_path, layout, weighting, center):
    """PPO (policy, value head on the replayed hidden states, whitened advantages) on the tiny
    MoE with r3: packed and flat gradients agree to 1e-5 in both layouts."""
    tree, flat = _tree_and_flat(tmp_path, weighting, ppo=True)
    cfg = PPOConfig(lr=1e-3, max_grad_norm=0.0, is_correction="mis_sequence", epochs=1,
                    minibatches=1, whiten_center=center)  # fmt: skip
    worst, dloss, _, _ = _moe_compare(Learner.ppo, cfg, tree, flat, plant=True)
    assert worst <= TOL and dloss <= 1e-6, f"ppo {weighting} {layout}: {worst:.3g} {dloss:.3g}"


def test_without_replay_a_planted_tie_routes_the_layouts_apart(tmp_path, layout):
    """The same planted tie with routing_replay off: tokens go to different experts in the
    packed and the flat learner, and the gradients disagree far beyond round-off (the first
    update's loss does not show it: its ratios are 1 in both)."""
    tree, flat = _tree_and_flat(tmp_path, "token", ppo=False)
    cfg = GRPOConfig(lr=1e-3, max_grad_norm=0.0, is_correction="none", routing_replay="off")
    worst, _, _, _ = _moe_compare(Learner.grpo, cfg, tree, flat, plant=True)
    assert worst > 100 * TOL, f"{layout}: max |g_packed - g_flat| = {worst:.3g}"
    # unplanted, the two layouts route alike: they agree without replay too
    worst, dloss, _, _ = _moe_compare(Learner.grpo, cfg, tree, flat, plant=False)
    assert worst <= TOL and dloss <= 1e-6, f"{layout} unplanted: {worst:.3g} {dloss:.3g}"


@pytest.mark.parametrize("batch_packed", [False, True], ids=["group", "batch"])
@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_group_and_batch_packed_moe_equals_sessions_with_replay(tmp_path, algo, batch_packed):
    """Group- and batch-packed samples (one shared system prompt) train like their per-session
    samples on the tiny MoE with r3, a quarter of the tokens unrecorded (R2 for them: each
    learner's own first-pass choice, alike in both layouts when nothing is tied)."""
    ppo = algo == "ppo"
    make = Learner.ppo if ppo else Learner.grpo
    cfg = (
        PPOConfig(lr=1e-3, max_grad_norm=0.0, epochs=1, minibatches=1)
        if ppo
        else GRPOConfig(lr=1e-3, max_grad_norm=0.0, is_correction="mis_token")
    )
    rng = random.Random(7)
    vocab = 2000
    system = [rng.randrange(3, vocab) for _ in range(12)]
    tasks = [[rng.randrange(3, vocab) for _ in range(4)] for _ in range(2 if batch_packed else 1)]
    sessions = [group_rollout(rng, 3 * t + k, system + task, vocab, ppo)
                for t, task in enumerate(tasks) for k in range(3)]  # fmt: skip
    for s, lp in zip(sessions, Learner.grpo(GRPOConfig(), MOE).logprobs(sessions), strict=True):
        s["logprobs"] = lp  # engine logprobs: the learner's own (0 on context tokens)
    packed = with_routing([merge_group(sessions)], tmp_path / "g.routing", unrecorded=0.25)
    per_session = with_routing(sessions, tmp_path / "s.routing", unrecorded=0.25)
    worst, dloss, m, _ = _moe_compare(make, cfg, packed, per_session, plant=False)
    assert worst <= TOL and dloss <= 1e-6, f"{algo}: {worst:.3g} {dloss:.3g}"
    assert 0.5 < m["routing_recorded_fraction"] < 1.0


class _Ratios:
    """The learner's objective, recording each training pass's ratio pi_theta / pi_old."""

    def __init__(self, inner):
        self.inner, self.ratios = inner, []
        self.at_sampling_settings = inner.at_sampling_settings

    def __call__(self, lp, old, A, agg, tok):
        self.ratios.append(torch.exp(lp.detach() - old["logp_old"]))
        return self.inner(lp, old, A, agg, tok)


@pytest.mark.parametrize("mode", ["r2", "r3", "off"])
def test_later_passes_replay_the_first_passs_routing(mode):
    """R2 within a step: phase 1 forwards the three samples together, the minibatches one each,
    and the planted tie routes the two apart. Replayed (r2, and r3 without recorded rows), the
    first update's ratios are 1 to round-off; routed live (off) they are not."""
    rows = [tree_sample([-1, 0, 1, 2, 2, 4, 5, 6], [0, 1, 1, 1, 1, 1, 1, 1], seed=k,
                        sample_id=f"s{k}") for k in range(3)]  # fmt: skip
    cfg = GRPOConfig(lr=1e-3, micro_batch_size=4, minibatches=3, routing_replay=mode)
    learner = Learner.grpo(cfg, MOE)
    rec = _Ratios(learner.objective)
    learner.objective = rec
    with planted_tie(learner, None, single_rows=8):
        m = learner.step(rows)
    worst = float((rec.ratios[0] - 1).abs().max())
    assert "routing_flip_rate" not in m and m["routing_recorded_fraction"] == 0.0
    if mode == "off":
        assert worst > 1e-3, f"off: max |ratio - 1| = {worst:.3g}"
    else:
        assert worst < 1e-5, f"{mode}: max |ratio - 1| = {worst:.3g}"


def test_replaying_the_learners_own_routing_changes_nothing(tmp_path):
    """Recorded rows equal to the learner's own choices: flip rate 0, and r3 gives the loss and
    weight bits of routing_replay off (replay reproduces a forward bit for bit). One update:
    after it the live routing may move, which replay exists to prevent."""
    rows = [tree_sample([-1, 0, 1, 2, 2, 4, 5], [0, 1, 1, 1, 1, 1, 1], seed=k, sample_id=f"s{k}")
            for k in range(3)]  # fmt: skip
    probe = Learner.grpo(GRPOConfig(), MOE)
    batch = pack([Sample.from_dict(r) for r in rows])
    _, routed = probe._hidden(batch, None)
    assert routed is not None
    for k, r in enumerate(rows):
        used = routed.used[k, : len(r["parent"])].numpy()
        r["routing"] = {**append_routing(tmp_path / "own.routing", used, E),
                        "file": str(tmp_path / "own.routing")}  # fmt: skip
    out = {}
    for mode in ("r3", "off"):
        learner = Learner.grpo(GRPOConfig(lr=1e-3, routing_replay=mode), MOE)
        m = learner.step(rows)
        out[mode] = (m, [p.detach().clone() for p in learner.policy.parameters()])
    assert out["r3"][0]["routing_flip_rate"] == 0.0 == out["off"][0]["routing_flip_rate"]
    assert out["r3"][0]["loss"] == out["off"][0]["loss"]
    assert all(torch.equal(p, q) for p, q in zip(out["r3"][1], out["off"][1], strict=True))


def test_dense_model_takes_todays_path(tiny, tmp_path, monkeypatch):
    """A dense policy never routes: no routing metric, and every routing_replay / moe_aux_loss
    setting gives the loss and weight bits of the dense code path (moe_hidden never called)."""
    rows = [tree_sample([-1, 0, 1, 1, 3], [0, 1, 1, 1, 1], seed=k, sample_id=f"d{k}")
            for k in range(2)]  # fmt: skip

    def refuse(*_a, **_kw):
        raise AssertionError("a dense model ran an MoE forward")

    monkeypatch.setattr(learner_mod, "moe_hidden", refuse)
    out = []
    for mode, aux in (("auto", 0.0), ("r3", 0.5), ("off", 0.0)):
        learner = Learner.grpo(GRPOConfig(lr=1e-3, routing_replay=mode, moe_aux_loss=aux), tiny)
        m = learner.step(rows)
        assert not {"routing_flip_rate", "routing_recorded_fraction", "expert_load_max",
                    "moe_aux_loss"} & set(m)  # fmt: skip
        out.append((m["loss"], [p.detach().clone() for p in learner.policy.parameters()]))
    for loss, params in out[1:]:
        assert loss == out[0][0]
        assert all(torch.equal(p, q) for p, q in zip(params, out[0][1], strict=True))


def test_keep_sessions_and_pack_carry_the_routing(tmp_path):
    """keep_sessions cuts a group sample's routing rows with its tokens; pack pads them with -1
    and permutes nothing (the batch's token order)."""
    rng = random.Random(1)
    system = [rng.randrange(3, 2000) for _ in range(6)]
    sessions = [group_rollout(rng, k, system, 2000, False) for k in range(3)]
    (group,) = with_routing([merge_group(sessions)], tmp_path / "g.routing")
    s = Sample.from_dict(group)
    cut = keep_sessions(s, [True, False, True])
    assert cut.routing is not None and cut.routing.shape[0] == len(cut)
    want = prefix_routing(list(cut.parent), list(cut.input_ids))
    assert np.array_equal(cut.routing.load(), want)
    batch = pack([cut, Sample.from_dict(tree_sample([-1, 0], [0, 1]))])
    assert batch.routing is not None and batch.routing.shape == (2, len(cut), L, K)
    assert np.array_equal(batch.routing[0].numpy(), want) and (batch.routing[1] == -1).all()
    assert pack([Sample.from_dict(tree_sample([-1, 0], [0, 1]))]).routing is None


def test_recorded_routing_read_next_to_the_samples_file(tmp_path):
    """Samples read from a file find their routing next to it: the learner's logprobs replay it
    under r3 (unlike the live experts: other logprobs than off); claw-rl values runs with
    --routing-replay, and refuses routing for another model (3 layers) naming file, line and
    field."""
    from claw_rl.cli import main
    from claw_rl.records import read_samples
    from click.testing import CliRunner

    rows = [tree_sample([-1, 0, 1, 1, 3], [0, 1, 1, 1, 1], seed=k, sample_id=f"v{k}", returns=True)
            for k in range(2)]  # fmt: skip
    for r in rows:
        a = prefix_routing(r["parent"], r["input_ids"])
        r["routing"] = append_routing(tmp_path / "s.routing", a, E)
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    samples = read_samples(tmp_path / "s.jsonl")
    lp = {
        m: Learner.grpo(GRPOConfig(routing_replay=m), MOE).logprobs(samples) for m in ("r3", "off")
    }
    assert lp["r3"] != lp["off"]
    res = CliRunner().invoke(main, ["values", "--model", str(MOE), "--samples",
                                    str(tmp_path / "s.jsonl"), "--critic", "head",
                                    "--routing-replay", "r3"])  # fmt: skip
    assert res.exit_code == 0 and len(res.stdout.splitlines()) == 2, res.output
    wrong = {**rows[0], "routing": append_routing(tmp_path / "s.routing", np.zeros((5, 3, K)), E)}
    (tmp_path / "bad.jsonl").write_text(json.dumps(wrong) + "\n")
    res = CliRunner().invoke(main, ["values", "--model", str(MOE), "--samples",
                                    str(tmp_path / "bad.jsonl"), "--critic", "head"])  # fmt: skip
    assert res.exit_code != 0
    assert "bad.jsonl:1" in res.output and "'routing': 3 MoE layers" in res.output


# -- the reference and a separate critic replay the policy's experts --------------------------


def _planted(tmp_path: Path, returns: bool = False) -> list[dict]:
    """Three samples whose recorded routing is random experts (a function of the prefix): a
    live forward picks other experts for most (token, layer) rows."""
    rows = [tree_sample([-1, 0, 1, 2, 2, 4, 5, 6], [0, 1, 1, 1, 1, 1, 1, 1], seed=k,
                        sample_id=f"p{k}", returns=returns) for k in range(3)]  # fmt: skip
    return with_routing(rows, tmp_path / "planted.routing")


def _one_batch(learner: Learner, rows: list[dict]) -> tuple[list[Sample], packing.Batch]:
    """The samples and the one micro-batch phase 1 forwards them in (micro_batch_size 4)."""
    samples = learner._samples(rows)
    return samples, packing.to_device(pack(samples), learner.device)


def test_reference_replays_the_policys_experts(tmp_path):
    """GRPO with a KL penalty on the tiny MoE, r3 with a planted routing: the reference's
    logprobs are bit for bit a forward of the reference with that routing replayed (and the
    policy's own logp_old: the same weights), not its live forward's."""
    from claw_rl.forward import moe_hidden, token_logprobs

    rows = _planted(tmp_path)
    learner = Learner.grpo(GRPOConfig(kl_coef=0.1), MOE)
    assert learner.reference is not None and learner.reference_replays
    samples, batch = _one_batch(learner, rows)
    metrics: dict = {}
    old = learner._old(samples, metrics)
    assert metrics["routing_flip_rate"] > 0.5
    got = torch.cat([old.tokens[k]["logp_ref"] for k in range(len(samples))])
    ref = learner.reference.model
    with torch.no_grad():
        want = token_logprobs(ref, moe_hidden(ref, batch, batch.routing)[0], batch).logprobs
        live = learner.reference.logprobs(batch)
    assert torch.equal(got, want)
    assert torch.equal(got, torch.cat([old.tokens[k]["logp_old"] for k in range(len(samples))]))
    assert float((got - live).abs().max()) > 1e-3
    m = learner.step(rows)
    assert math.isfinite(m["kl_ref"]) and m["kl_ref"] < 1e-6  # policy = reference before it


def test_separate_critic_replays_the_policys_experts(tmp_path):
    """PPO with a separate MoE critic backbone, r3 with a planted routing: phase 1's old values
    and Learner.values are bit for bit the value head on the backbone's forward with that
    routing replayed, not on its live forward's; a step trains it."""
    from claw_rl.forward import moe_hidden, values_per_token

    rows = _planted(tmp_path, returns=True)
    learner = Learner.ppo(PPOConfig(critic="model", lr=1e-3), MOE)
    critic = learner.critic
    assert critic is not None and critic.backbone is not None and learner.critic_replays
    torch.manual_seed(0)
    with torch.no_grad():
        critic.head.linear.weight.normal_(0, 1.0)
    samples, batch = _one_batch(learner, rows)
    old = learner._old(samples, {})
    b, i, _ = batch.predictor_index()
    got = torch.cat([old.tokens[k]["values_old"] for k in range(len(samples))])
    with torch.no_grad():
        want = values_per_token(critic.head, moe_hidden(critic.backbone, batch, batch.routing)[0],
                                batch)  # fmt: skip
        live = critic.values(batch, None)
    assert torch.equal(got, want[b, i])
    assert float((want - live).abs().max()) > 1e-3
    values = learner.values(samples)
    for k, v in enumerate(values):
        assert v["values"] == want[k, : len(samples[k])].tolist()
    m = learner.step(rows)
    assert math.isfinite(m["value_loss"]) and m["value_loss"] > 0


def test_reference_of_another_layout_routes_live_with_a_warning(tmp_path, caplog):
    """A reference MoE with top 1 (the policy picks 2) cannot replay the policy's routing: one
    warning at construction, and its logprobs are its live forward's."""
    other = tmp_path / "top1"
    other.mkdir()
    for f in MOE.iterdir():
        (other / f.name).symlink_to(f)
    config = json.loads((MOE / "config.json").read_text())
    (other / "config.json").unlink()
    (other / "config.json").write_text(json.dumps({**config, "num_experts_per_tok": 1}))
    rows = _planted(tmp_path)
    with caplog.at_level("WARNING", logger="claw_rl"):
        learner = Learner.grpo(GRPOConfig(kl_coef=0.1, ref_model=str(other)), MOE)
    warned = [r for r in caplog.records if "cannot replay the policy's routing" in r.message]
    assert len(warned) == 1 and "top 1" in warned[0].message
    assert learner.reference is not None and not learner.reference_replays
    samples, batch = _one_batch(learner, rows)
    old = learner._old(samples, {})
    got = torch.cat([old.tokens[k]["logp_ref"] for k in range(len(samples))])
    with torch.no_grad():
        assert torch.equal(got, learner.reference.logprobs(batch))


def test_dense_reference_and_critic_never_route(tiny, monkeypatch):
    """A dense policy with a KL reference and a separate critic model: neither enters route()
    (nor moe_hidden), so their forwards are today's backbone_hidden ones, bit for bit."""
    from claw_rl import _moe
    from claw_rl import critic as critic_mod

    def refuse(*_a, **_kw):
        raise AssertionError("a dense model entered an MoE forward")

    for module, name in ((_moe, "route"), (learner_mod, "moe_hidden"), (critic_mod, "moe_hidden")):
        monkeypatch.setattr(module, name, refuse)
    rows = {ppo: [tree_sample([-1, 0, 1, 1, 3], [0, 1, 1, 1, 1], seed=k, sample_id=f"d{k}",
                              returns=ppo) for k in range(2)] for ppo in (False, True)}  # fmt: skip
    grpo = Learner.grpo(GRPOConfig(lr=1e-3, kl_coef=0.1, routing_replay="r3"), tiny)
    assert not grpo.reference_replays and math.isfinite(grpo.step(rows[False])["kl_ref"])
    ppo = Learner.ppo(PPOConfig(lr=1e-3, critic="model", routing_replay="r3"), tiny)
    assert not ppo.critic_replays and math.isfinite(ppo.step(rows[True])["value_loss"])
    assert len(ppo.values(rows[True])) == 2
