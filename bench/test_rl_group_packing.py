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
