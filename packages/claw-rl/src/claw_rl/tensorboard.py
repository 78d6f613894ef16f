"""Optional TensorBoard logging of a run's metrics rows (``pip install 'claw-rl[tensorboard]'``).

    board = TensorBoard(run / "tensorboard")
    board.log(row)          # a claw_rl.loop metrics row: every number in it, as a scalar
    board.close()

Each number of the row becomes a scalar at ``global_step = row["step"]``, its tag the path of
keys (``reward/claw-agent-text``, ``time/train_s``, ``learner/loss``, ``staleness/1``); other
values (strings, lists) are skipped. Written with torch's ``SummaryWriter``; view with
``tensorboard --logdir RUN/tensorboard``. Off unless asked for: nothing imports this module by
default, and without the extra it raises :class:`~claw_rl.errors.ClawError` saying what to
install.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

from claw_rl.errors import ClawError


def scalars(row: dict, prefix: str = "") -> Iterator[tuple[str, float]]:
    """``(tag, value)`` for every finite number in a (nested) metrics row, except ``step``."""
    for key, value in row.items():
        tag = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from scalars(value, tag + "/")
        elif isinstance(value, int | float) and tag != "step" and math.isfinite(value):
            yield tag, float(value)


class TensorBoard:
    """A TensorBoard event file in ``log_dir``, one point per metrics row and number."""

    def __init__(self, log_dir: str | Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ClawError(
                f"TensorBoard logging needs the tensorboard package ({exc}); "
                "install claw-rl with the extra: pip install 'claw-rl[tensorboard]'"
            ) from exc
        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, row: dict) -> None:
        step = int(row["step"])
        for tag, value in scalars(row):
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


__all__ = ["TensorBoard", "scalars"]
