"""claw_rl.tensorboard: metrics rows as TensorBoard scalars (the optional extra)."""

from __future__ import annotations

import pytest
from claw_rl.tensorboard import scalars


def test_scalars_flatten_every_number_of_a_row():
    """Nested numbers become slash-separated tags; step, strings, lists and NaN are left out."""
    row = {
        "step": 3,
        "reward": {"a": 0.5},
        "staleness": {"0": 4, "1": 2},
        "time": {"train_s": 1.5},
        "learner": {"loss": -0.1, "skipped": "no", "nan": float("nan")},
        "ids": [1, 2],
    }
    assert dict(scalars(row)) == {
        "reward/a": 0.5,
        "staleness/0": 4.0,
        "staleness/1": 2.0,
        "time/train_s": 1.5,
        "learner/loss": -0.1,
    }


def test_rows_are_written_as_scalars_per_step(tmp_path):
    """Two rows logged: TensorBoard reads back each tag with the rows' steps and values."""
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from claw_rl.tensorboard import TensorBoard
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = TensorBoard(tmp_path / "tb")
    board.log({"step": 0, "reward": {"a": 0.25}, "learner": {"loss": 1.0}})
    board.log({"step": 1, "reward": {"a": 0.75}, "learner": {"loss": 0.5}})
    board.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"reward/a", "learner/loss"}
    assert [(e.step, e.value) for e in events.Scalars("reward/a")] == [(0, 0.25), (1, 0.75)]
    assert [(e.step, e.value) for e in events.Scalars("learner/loss")] == [(0, 1.0), (1, 0.5)]
