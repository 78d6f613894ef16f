"""Per-token sampling settings: the learner's logprob of a token is that of the distribution the
engine drew it from (temperature, top_k, top_p of its call), for the ratio, TIS/MIS and mismatch."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
import torch
from claw_rl.calls import call_to_sample
from claw_rl.cli import main
from claw_rl.config import GRPOConfig
from claw_rl.errors import ConfigError, RecordError
from claw_rl.forward import backbone_hidden, sampling_log_softmax, token_logprobs
from claw_rl.learner import Learner, load_policy
from claw_rl.packing import chain_sample, pack, path_matrix
from claw_rl.records import Sample
from click.testing import CliRunner
from rl_testlib import random_tree, tree_sample

SETTINGS = [
    (1.0, 1.0, 0),
    (0.7, 1.0, 0),
    (0.5, 0.9, 0),
    (1.3, 1.0, 7),
    (0.8, 0.8, 20),
    (0.6, 0.3, 3),
    (0.0, 1.0, 0),
]


def _reference_logprob(logits: np.ndarray, token: int, T: float, top_p: float, top_k: int) -> float:
    """log pi(token) by hand in float64: logits / T, keep the top_k largest (ties kept), then the
    largest-first prefix whose renormalised mass before each token is < top_p; the sampled token
    always counts as kept; greedy (T = 0) is taken at T = 1 without truncation."""
    if T == 0:
        T, top_p, top_k = 1.0, 1.0, 0
    z = logits.astype(np.float64) / T
    kept = np.ones(len(z), dtype=bool)
    if 0 < top_k < len(z):
        kth = np.sort(z)[::-1][top_k - 1]
        kept &= z >= kth
    if top_p < 1.0:
        order = [j for j in np.argsort(-z, kind="stable") if kept[j]]
        mass = np.exp(z[order] - z[order].max())
        mass /= mass.sum()
        before = 0.0
        keep_p = np.zeros(len(z), dtype=bool)
        for j, m in zip(order, mass, strict=True):
            if before >= top_p:
                break
            keep_p[j] = True
            before += m
        kept &= keep_p
    kept[token] = True
    zk = z[kept]
    return float(z[token] - (zk.max() + np.log(np.exp(zk - zk.max()).sum())))


def _with_settings(row: dict, rng: random.Random) -> dict:
    picks = [rng.choice(SETTINGS) if t else (1.0, 1.0, 0) for t in row["trainable"]]
    return {
        **row,
        "temperatures": [p[0] for p in picks],
        "top_ps": [p[1] for p in picks],
        "top_ks": [p[2] for p in picks],
    }


def test_mixed_per_token_settings_equal_a_per_path_reference(tiny):
    """One packed batch of trees whose tokens carry mixed settings: every logprob equals the
    by-hand truncated log_softmax(logits / T) of an ordinary per-path forward (fp32, <= 1e-5)."""
    model = load_policy(tiny, torch.float32)
    vocab = model.config.vocab_size
    rng = random.Random(3)
    samples = []
    for k, n in enumerate([31, 18, 44]):
        parent = random_tree(n, 7 + k)
        trainable = [0 if p < 0 else int(j % 4 != 0) for j, p in enumerate(parent)]
        row = _with_settings(
            tree_sample(parent, trainable, seed=k, sample_id=f"t{k}", vocab=vocab), rng
        )
        samples.append(Sample.from_dict(row))
    batch = pack(samples)
    with torch.no_grad():
        st = token_logprobs(model, backbone_hidden(model, batch), batch)
    b, i, _ = batch.predictor_index()
    got = {
        (int(bb), int(j)): float(v)
        for bb, j, v in zip(b.tolist(), i.tolist(), st.logprobs.tolist(), strict=True)
    }
    assert all(math.isfinite(v) for v in got.values()) and torch.isfinite(st.entropy).all()
    assert int(st.greedy.sum()) == sum(1 for (bb, j) in got if samples[bb].temperatures[j] == 0)
    worst, seen_settings = 0.0, set()
    for k, s in enumerate(samples):
        for row in path_matrix(s.parent):
            idx = np.nonzero(row)[0].tolist()
            with torch.no_grad():
                logits = (
                    model(input_ids=torch.tensor([[s.input_ids[j] for j in idx]]))
                    .logits[0]
                    .float()
                    .numpy()
                )
            for pos, j in enumerate(idx):
                if s.trainable[j]:
                    setting = (s.temperatures[j], s.top_ps[j], s.top_ks[j])
                    seen_settings.add(setting)
                    ref = _reference_logprob(logits[pos - 1], s.input_ids[j], *setting)
                    worst = max(worst, abs(got[(k, j)] - ref))
    assert seen_settings == set(SETTINGS)  # every kind of setting was exercised in the one batch
    assert worst <= 1e-5, worst


def test_kept_set_gradient_flows_only_through_kept_logits():
    """Truncated tokens get exactly zero gradient, kept ones a finite non-zero one; T = 1 with no
    truncation is plain log_softmax."""
    torch.manual_seed(0)
    logits = torch.randn(4, 50, requires_grad=True)
    T = torch.tensor([0.7, 1.0, 0.5, 1.0])
    p = torch.tensor([0.8, 1.0, 1.0, 1.0])
    k = torch.tensor([0, 5, 0, 0])
    targets = logits.detach().argmax(-1)
    logp = sampling_log_softmax(logits, T, p, k, targets)
    logp.gather(1, targets[:, None]).sum().backward()
    kept = torch.isfinite(logp)
    assert kept[1].sum() == 5 and kept[2].all() and 1 < kept[0].sum() < 50
    assert (logits.grad[~kept] == 0).all() and torch.isfinite(logits.grad).all()
    assert (logits.grad[kept] != 0).all()
    assert torch.equal(logp[3], torch.log_softmax(logits[3], -1))
    assert torch.allclose(logp.detach().exp().sum(-1), torch.ones(4), atol=1e-6)  # renormalised


def _sample_chain(
    model, prompt: list[int], n: int, T: float, top_p: float, top_k: int, gen: torch.Generator
) -> tuple[list[int], list[float]]:
    """Tokens drawn from the tiny model at these settings, with the engine's logprobs of the
    distribution drawn from (written here independently of claw_rl.forward)."""
    ids, lps = list(prompt), []
    for _ in range(n):
        with torch.no_grad():
            z = model(input_ids=torch.tensor([ids])).logits[0, -1].float() / T
        if top_k:
            z = torch.where(z >= torch.topk(z, top_k).values[-1], z, torch.tensor(float("-inf")))
        if top_p < 1.0:
            probs, order = torch.sort(torch.softmax(z, -1), descending=True)
            cut = order[(torch.cumsum(probs, -1) - probs) >= top_p]
            z[cut] = float("-inf")
        logp = torch.log_softmax(z, -1)
        tok = int(torch.multinomial(logp.exp(), 1, generator=gen))
        ids.append(tok)
        lps.append(float(logp[tok]))
    return ids[len(prompt) :], lps


@pytest.mark.parametrize(("T", "top_p", "top_k"), [(0.7, 1.0, 0), (0.7, 0.9, 20)])
def test_samples_drawn_at_their_settings_show_no_mismatch_and_unit_tis_weights(
    tiny, T, top_p, top_k
):
    """Tokens drawn at T = 0.7 (and with top_p / top_k): mismatch ~0 and TIS weights ~1 once
    the sample carries its settings; without them (the old global T = 1) the mismatch is large."""
    model = load_policy(tiny, torch.float32)
    gen = torch.Generator().manual_seed(11)
    samples = []
    for k in range(3):
        prompt = [5 + k, 17, 29, 40 + k]
        comp, lps = _sample_chain(model, prompt, 24, T, top_p, top_k, gen)
        n_p, n_c = len(prompt), len(comp)
        samples.append(
            chain_sample(
                f"c{k}",
                prompt,
                comp,
                lps,
                advantages=(0.0,) * n_p + (1.0 - k,) * n_c,
                temperatures=(1.0,) * n_p + (T,) * n_c,
                top_ps=(1.0,) * n_p + (top_p,) * n_c,
                top_ks=(0,) * n_p + (top_k,) * n_c,
            ).to_dict()
        )
    learner = Learner.grpo(GRPOConfig(lr=1e-5, is_correction="tis", is_cap=2.0), tiny)
    m = learner.step(samples)
    assert m["mismatch_max_abs"] < 1e-4 and m["mismatch_kl_k3"] < 1e-8
    assert m["is_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert m["greedy_tokens"] == 0 and math.isfinite(m["loss"])
    untagged = [
        {k: v for k, v in s.items() if k not in ("temperatures", "top_ps", "top_ks")}
        for s in samples
    ]
    m_old = Learner.grpo(GRPOConfig(lr=1e-5), tiny).step(untagged)
    assert (
        m_old["mismatch_mean_abs"] > 0.05
    )  # the bug this guards against: a mismatch that is not there


def test_greedy_tokens_leave_the_loss_and_the_metrics(tiny):
    """Greedy tokens (T = 0, engine logprob 0.0) are counted, give no NaN/inf, and do not move the
    mismatch; a batch of only greedy tokens has zero loss."""
    prompt, comp = [5, 6, 7, 8], [40, 41, 42, 43]
    own = Learner.grpo(GRPOConfig(), tiny).logprobs([chain_sample("c", prompt, comp)])[0][
        len(prompt) :
    ]
    mixed = chain_sample(
        "m",
        prompt,
        comp,
        [own[0], 0.0, own[2], 0.0],
        advantages=(0.0,) * 4 + (1.0,) * 4,
        temperatures=(1.0,) * 5 + (0.0, 1.0, 0.0),
    ).to_dict()
    m = Learner.grpo(GRPOConfig(lr=1e-5), tiny).step([mixed])
    assert m["greedy_tokens"] == 2 and m["trainable_tokens"] == 4
    assert (
        m["mismatch_max_abs"] < 1e-5 and math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"])
    )
    only = chain_sample(
        "g",
        prompt,
        comp[:2],
        [0.0, 0.0],
        advantages=(0.0,) * 4 + (1.0,) * 2,
        temperatures=(1.0,) * 4 + (0.0, 0.0),
    ).to_dict()
    m = Learner.grpo(GRPOConfig(lr=1e-5), tiny).step([only])
    assert m["greedy_tokens"] == 2 and m["loss"] == 0.0 and m["grad_norm"] == 0.0


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("temperatures", -0.5, "'temperatures'[2] = -0.5 must be a finite number >= 0"),
        ("top_ps", 0.0, "'top_ps'[2] = 0.0 must be in (0, 1]"),
        ("top_ps", 1.5, "'top_ps'[2] = 1.5 must be in (0, 1]"),
        ("top_ks", -1, "'top_ks'[2] = -1 must be >= 0"),
        ("top_ks", 2.5, "'top_ks'[2] must be a"),
    ],
)
def test_bad_sample_settings_are_named(field, value, expected):
    """A bad per-token setting names the sample, the field and the index."""
    row = tree_sample([-1, 0, 1], [0, 1, 1])
    row[field] = [1 if field == "top_ks" else 1.0] * 3
    row[field][2] = value
    with pytest.raises(RecordError, match="s.jsonl:4") as info:
        Sample.from_dict(row, "s.jsonl:4")
    assert expected in str(info.value)
    row[field] = row[field][:2]
    with pytest.raises(RecordError, match="has 2 entries"):
        Sample.from_dict(row, "s.jsonl:4")


def test_sample_settings_round_trip_and_default_to_one():
    """The three arrays survive to_dict/from_dict; a sample without them packs at 1 / 1 / 0."""
    row = {
        **tree_sample([-1, 0, 1], [0, 1, 1]),
        "temperatures": [1.0, 0.7, 0.0],
        "top_ps": [1.0, 0.9, 1.0],
        "top_ks": [0, 5, 0],
    }
    s = Sample.from_dict(row)
    assert Sample.from_dict(s.to_dict()) == s and s.to_dict()["top_ks"] == [0, 5, 0]
    plain = Sample.from_dict(tree_sample([-1, 0, 1], [0, 1, 1]))
    assert "temperatures" not in plain.to_dict()
    batch = pack([plain, s])
    assert batch.temperatures.tolist() == [[1.0, 1.0, 1.0], [1.0, pytest.approx(0.7), 0.0]]
    assert batch.top_ks.tolist() == [[0, 0, 0], [0, 5, 0]]


def _call(**extra) -> dict:
    return {
        "schema": "claw.call/v1",
        "call_id": "c",
        "session": "s",
        "seq": 0,
        "prompt_ids": [5, 6],
        "completion_ids": [7, 8],
        "completion_logprobs": [-1.0, -2.0],
        **extra,
    }


def test_calls_carry_their_sampling_and_the_override():
    """claw-rl logprobs reads each call's sampling (absent = 1/1/0); --temperature overrides T only."""
    s = call_to_sample(
        _call(sampling={"temperature": 0.6, "top_p": 0.9, "top_k": 4, "forced": False}), "c:1"
    )
    assert (
        s.temperatures == (1.0, 1.0, 0.6, 0.6)
        and s.top_ps == (1.0, 1.0, 0.9, 0.9)
        and s.top_ks == (0, 0, 4, 4)
    )
    s = call_to_sample(_call(), "c:1")
    assert s.temperatures == (1.0,) * 4 and s.top_ks == (0,) * 4
    s = call_to_sample(_call(sampling={"temperature": 0.6, "top_k": 4}), "c:1", temperature=0.9)
    assert s.temperatures[2:] == (0.9, 0.9) and s.top_ks[2:] == (4, 4)
    for bad, msg in (
        ({"temperature": -1}, "sampling.temperature"),
        ({"top_p": 0}, "sampling.top_p"),
        ({"top_k": 1.5}, "sampling.top_k"),
        ([1], "'sampling' must be an object"),
    ):
        with pytest.raises(RecordError, match=r"calls.jsonl:3: .*" + msg.replace(".", r"\.")):
            call_to_sample(_call(sampling=bad), "calls.jsonl:3")


def test_logprobs_command_uses_each_calls_sampling(tiny, tmp_path):
    """Calls recorded at T = 0.7 with top_k match without any flag; forcing --temperature 1 shows
    the mismatch; a greedy call is counted, not compared."""
    model = load_policy(tiny, torch.float32)
    gen = torch.Generator().manual_seed(5)
    comp, lps = _sample_chain(model, [5, 6, 7], 12, 0.7, 1.0, 30, gen)
    rows = [
        _call(
            call_id="hot",
            prompt_ids=[5, 6, 7],
            completion_ids=comp,
            completion_logprobs=lps,
            sampling={"temperature": 0.7, "top_p": 1.0, "top_k": 30, "forced": False},
        ),
        _call(call_id="greedy", completion_logprobs=[0.0, 0.0], sampling={"temperature": 0.0}),
    ]
    calls = tmp_path / "calls.jsonl"
    calls.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = CliRunner().invoke(main, ["logprobs", "--model", str(tiny), "--calls", str(calls)])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stderr.strip().splitlines()[-1])
    assert summary["mismatch_max_abs"] < 1e-4 and summary["greedy_tokens"] == 2
    out = [json.loads(x) for x in r.stdout.splitlines()]
    assert out[1]["greedy"] == 2 and all(math.isfinite(v) for v in out[1]["logprobs"])
    r = CliRunner().invoke(
        main, ["logprobs", "--model", str(tiny), "--calls", str(calls), "--temperature", "1"]
    )
    assert json.loads(r.stderr.strip().splitlines()[-1])["mismatch_mean_abs"] > 0.05


def test_a_global_temperature_in_a_config_is_refused_with_the_reason():
    """The removed learner temperature is refused naming the per-token settings that replace it."""
    with pytest.raises(ConfigError, match="run.toml: 'temperature' is no longer a learner setting"):
        GRPOConfig.from_dict({"temperature": 0.7}, "run.toml")
