"""claw-tree --pack group vs per-session packing on GRPO groups of 8 Claude Code-shaped rollouts.

The rollouts of one group share the system prompt, the tool schemas and the first messages
(instruction, reminders, environment block: identical when the sandbox gives every rollout the
same working directory, as claw-sandbox's bwrap backend does), about 12.5K tokens for Claude
Code 2.1 (bench/harness_shapes.py, from the real requests in
../shared/fixtures/harness-requests/). Per-session packing trains that prefix once per rollout;
group packing once per group. The loss and gradient are the same
(packages/claw-rl/tests/test_group_packing.py, packages/claw-tree/tests/test_group_pack.py).

Trained tokens are counted at full size for three rollout lengths; one learner update is timed
at ``SCALE`` of every length on the tiny model. Goal: >= 3x fewer trained tokens.

Batch packing (``--pack batch``) goes one step further: the 8 groups of one optimizer batch (8
tasks of one harness, 8 rollouts each) share the harness's system prompt and tools (9.8K tokens
for Claude Code), so a batch sample holds them once instead of once per group; each task's
first messages stay once per group. The last two benches compare session, group and batch
packing on 8 x 8 rollouts: tokens at full size, one update at ``SCALE``.

Run: .venvs/workspace/bin/python -m pytest bench/test_rl_group_packing.py --benchmark-only -s
"""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("claw_tree")
claw_rl = pytest.importorskip("claw_rl")
import harness_shapes as shapes  # noqa: E402  (bench/ is on pytest's pythonpath)
from claw_tree import build_forest, build_samples  # noqa: E402
from test_rl_tree_vs_chain import MODELS  # noqa: E402

GROUP = 8
SCALE = 1 / 8
SHAPES = {  # name -> rollout options
    "the fixtures' task (2 calls)": dict(
        trajectory_tokens=0, compaction=False, subagent=False, side_calls=0
    ),
    "prefix + 2K": dict(trajectory_tokens=14_500, compaction=False, subagent=False, side_calls=0),
    "prefix + 4K": dict(trajectory_tokens=16_500, compaction=False, subagent=False, side_calls=0),
    "ClawGym average (18.7K)": dict(compaction=False, subagent=False, side_calls=0),
    "18.7K + compaction, sub-agent, 2 side calls": {},
}


def _packed(shape: dict, scale: float, vocab: int = 4000) -> tuple[list[dict], list[dict]]:
    try:
        prof = shapes.profile("claude-code")
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    calls, outcomes = shapes.group("task", GROUP, prof, scale=scale, vocab=vocab, **shape)
    forest = build_forest(calls)
    session = build_samples(forest, outcomes).samples
    group = build_samples(forest, outcomes, pack="group").samples
    return session, group


def _tokens(samples: list[dict]) -> int:
    return sum(len(s["input_ids"]) for s in samples)


def test_group_packing_token_ratio(benchmark):
    """Trained tokens, per-session vs group packing, groups of 8 at full size (timed: claw-tree
    building both packings of the last shape)."""
    ratios = {}
    for name, shape in SHAPES.items():
        if name == list(SHAPES)[-1]:
            session, group = benchmark.pedantic(_packed, (shape, 1.0), rounds=1, iterations=1)
        else:
            session, group = _packed(shape, 1.0)
        assert len(group) == 1 and len(session) == GROUP
        s, g = _tokens(session), _tokens(group)
        ratios[name] = s / g
        print(
            f"\n{name:45} per session {s:7d} tokens ({s / GROUP:.0f}/rollout) | group {g:7d} | "
            f"{s / g:.2f}x fewer (goal >= 3)"
        )
    benchmark.extra_info.update(ratios)
    assert all(r > 1.5 for r in ratios.values())


@pytest.mark.parametrize("width", sorted(MODELS))
def test_group_packing_update(benchmark, tmp_path_factory, width):
    """One learner update (at SCALE): per-session samples vs one group sample."""
    from claw_rl.tiny import TinySpec

    model = claw_rl.init_tiny(tmp_path_factory.mktemp("m") / width, TinySpec(**MODELS[width]))
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    session, group = _packed(SHAPES["ClawGym average (18.7K)"], SCALE, vocab)
    cfg = claw_rl.GRPOConfig(lr=1e-5, micro_batch_size=1)
    by_session, by_group = claw_rl.Learner.grpo(cfg, model), claw_rl.Learner.grpo(cfg, model)
    by_session.step(session[:1])  # warm up
    by_group.step(group)
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        by_session.step(session)
        times.append(time.perf_counter() - t0)
    session_s = min(times)
    group_times: list[float] = []

    def update():
        t0 = time.perf_counter()
        by_group.step(group)
        group_times.append(time.perf_counter() - t0)

    benchmark.pedantic(update, rounds=2, iterations=1)
    group_s = min(group_times)
    s, g = _tokens(session), _tokens(group)
    benchmark.extra_info.update(
        session_tokens=s, group_tokens=g, session_s=session_s, group_s=group_s
    )
    print(
        f"\n[{width}] 8 rollouts at scale {SCALE:g}: tokens per session {s}, group {g} ({s / g:.2f}x) | "
        f"update per session {session_s:.2f}s, group {group_s:.2f}s "
        f"(speedup {session_s / group_s:.2f})"
    )
    assert g < s


TASKS = 8
BATCH_MAX_TOKENS = 131_072  # --max-tokens of the batch samples at full size (scaled with SCALE)


def _batch_packed(shape: dict, scale: float, vocab: int = 4000) -> dict[str, list[dict]]:
    """8 groups x 8 rollouts of one harness: samples per session, per group, per batch (at most
    BATCH_MAX_TOKENS * scale tokens) and per batch without a budget (one sample)."""
    try:
        prof = shapes.profile("claude-code")
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    calls, outcomes = shapes.batch(TASKS, GROUP, prof, scale=scale, vocab=vocab, **shape)
    forest = build_forest(calls)
    budget = round(BATCH_MAX_TOKENS * scale)
    return {
        "session": build_samples(forest, outcomes).samples,
        "group": build_samples(forest, outcomes, pack="group").samples,
        "batch": build_samples(forest, outcomes, pack="batch", max_tokens=budget).samples,
        "batch, one sample": build_samples(forest, outcomes, pack="batch").samples,
    }


def test_batch_packing_token_ratio(benchmark):
    """Trained tokens of 8 groups x 8 Claude Code-shaped rollouts at full size: per session,
    per group, per batch (timed: claw-tree building all four packings of the ClawGym shape)."""
    extra = {}
    for name in ("the fixtures' task (2 calls)", "prefix + 2K", "ClawGym average (18.7K)"):
        if name == "ClawGym average (18.7K)":
            packed = benchmark.pedantic(_batch_packed, (SHAPES[name], 1.0), rounds=1, iterations=1)
        else:
            packed = _batch_packed(SHAPES[name], 1.0)
        n = {pack: _tokens(samples) for pack, samples in packed.items()}
        assert len(packed["session"]) == TASKS * GROUP and len(packed["group"]) == TASKS
        assert n["batch, one sample"] <= n["batch"] < n["group"] < n["session"]
        extra[name] = n
        print(
            f"\n{name:30} 8x8 rollouts: per session {n['session']:8d} tokens | group "
            f"{n['group']:7d} ({n['session'] / n['group']:.2f}x) | batch <= {BATCH_MAX_TOKENS} "
            f"{n['batch']:7d} ({n['session'] / n['batch']:.2f}x, {n['group'] / n['batch']:.2f}x "
            f"of group; {len(packed['batch'])} samples) | batch in one sample "
            f"{n['batch, one sample']:7d} ({n['session'] / n['batch, one sample']:.2f}x)"
        )
    benchmark.extra_info.update(extra)


def test_batch_packing_update(benchmark, tmp_path_factory):
    """One learner update (tiny model, at SCALE) on 8 groups x 8 rollouts: per-session samples,
    group samples and batch samples, each timed in the same run (ratios against session)."""
    from claw_rl.tiny import TinySpec

    model = claw_rl.init_tiny(tmp_path_factory.mktemp("m") / "tiny", TinySpec(**MODELS["tiny"]))
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    packed = _batch_packed(SHAPES["ClawGym average (18.7K)"], SCALE, vocab)
    del packed["batch, one sample"]
    cfg = claw_rl.GRPOConfig(lr=1e-5, micro_batch_size=1)
    learners = {pack: claw_rl.Learner.grpo(cfg, model) for pack in packed}
    for pack, learner in learners.items():
        learner.step(packed[pack][:1])  # warm up
    seconds: dict[str, float] = {}
    for pack in ("session", "group"):
        t0 = time.perf_counter()
        learners[pack].step(packed[pack])
        seconds[pack] = time.perf_counter() - t0
    batch_times: list[float] = []

    def update():
        t0 = time.perf_counter()
        learners["batch"].step(packed["batch"])
        batch_times.append(time.perf_counter() - t0)

    benchmark.pedantic(update, rounds=1, iterations=1)
    seconds["batch"] = min(batch_times)
    n = {pack: _tokens(samples) for pack, samples in packed.items()}
    benchmark.extra_info.update(tokens=n, seconds=seconds)
    print(
        "\n8x8 rollouts at scale "
        f"{SCALE:g}: "
        + " | ".join(
            f"{pack} {n[pack]} tokens in {len(packed[pack])} samples, update {seconds[pack]:.2f}s "
            f"({n['session'] / n[pack]:.2f}x fewer tokens, {seconds['session'] / seconds[pack]:.2f}x faster)"
            for pack in packed
        )
    )
    assert n["batch"] < n["group"] < n["session"]
