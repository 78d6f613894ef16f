"""Optional run tracking: the metrics rows of a run to TensorBoard and / or Weights & Biases.

    trackers = open_trackers(run, tensorboard=True, wandb=True, config=cfg.to_dict())
    for row in rows:
        for t in trackers:
            t.log(row)   # every number of the row, tag = path of keys (learner/loss)
    close_trackers(trackers)

Both log the same points: :func:`claw_rl.tensorboard.scalars` of each row at ``step =
row["step"]``. TensorBoard writes ``RUN/tensorboard`` (``pip install 'claw-rl[tensorboard]'``);
W&B writes its run under ``RUN/wandb`` (``pip install 'claw-rl[wandb]'``). W&B follows its own
environment: ``WANDB_MODE=offline`` needs no network and no account, and leaves
``RUN/wandb/offline-run-*/run-*.wandb`` for ``wandb sync`` later; ``WANDB_PROJECT`` /
``WANDB_ENTITY`` choose where an online run goes. Without the extra each raises
:class:`~claw_rl.errors.ClawError` saying what to install.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from claw_rl.errors import ClawError
from claw_rl.tensorboard import TensorBoard, scalars


class Tracker(Protocol):
    def log(self, row: dict) -> None: ...

    def close(self) -> None: ...


class WandB:
    """A W&B run in ``run_dir/wandb``, one history point per metrics row."""

    def __init__(self, run_dir: str | Path, *, name: str | None = None, config: dict | None = None):
        try:
            import wandb
        except ImportError as exc:
            raise ClawError(
                f"W&B logging needs the wandb package ({exc}); install claw-rl with the extra: "
                "pip install 'claw-rl[wandb]'"
            ) from exc
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        try:
            self.run: Any = wandb.init(
                dir=str(run_dir),
                name=name or Path(run_dir).resolve().name,
                config=config or {},
                reinit="create_new",
            )
        except Exception as exc:  # wandb raises its own errors (no API key online, ...)
            raise ClawError(
                f"W&B run could not start ({type(exc).__name__}: {exc}); without a network or "
                "an account set WANDB_MODE=offline and `wandb sync` the run later"
            ) from exc

    def log(self, row: dict) -> None:
        self.run.log(dict(scalars(row)), step=int(row["step"]))

    def close(self) -> None:
        self.run.finish()


def open_trackers(
    run_dir: str | Path,
    *,
    tensorboard: bool = False,
    wandb: bool = False,
    config: dict | None = None,
) -> list[Tracker]:
    """The trackers asked for, writing under ``run_dir`` (none: an empty list)."""
    out: list[Tracker] = []
    if tensorboard:
        out.append(TensorBoard(Path(run_dir) / "tensorboard"))
    if wandb:
        out.append(WandB(run_dir, config=config))
    return out


def close_trackers(trackers: list[Tracker]) -> None:
    for t in trackers:
        t.close()


__all__ = ["Tracker", "WandB", "close_trackers", "open_trackers"]
