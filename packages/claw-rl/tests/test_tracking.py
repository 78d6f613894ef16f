"""`--tensorboard` / `--wandb` on `claw-rl sft|train` (claw_rl.tracking): both log every number of
each metrics row at its step; W&B in offline mode writes a run `wandb sync` reads."""

from __future__ import annotations

import json
import struct

import pytest
from claw_rl.cli import main
from claw_rl.tensorboard import scalars
from click.testing import CliRunner
from rl_testlib import sft_chain_rows as _rows
from rl_testlib import write_rows as _write

_BLOCK = 32768  # the .wandb file is a LevelDB-style log: 32 KiB blocks of framed records


def _wandb_records(path) -> list:
    """Every record of a ``run-*.wandb`` file, parsed with wandb's own protobuf messages."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"  # the header `wandb sync` checks
    out, buf, pos = [], b"", 7
    while pos + 7 <= len(data):
        if _BLOCK - pos % _BLOCK < 7:  # a block's tail too short for a header is padding
            pos += _BLOCK - pos % _BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # zero padding to the block end
            pos += _BLOCK - pos % _BLOCK
            continue
        buf += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL, LAST
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
            buf = b""
    return out


def _history(records) -> dict[int, dict[str, float]]:
    """step -> {key: value} of the history records."""
    out: dict[int, dict[str, float]] = {}
    for rec in records:
        if rec.WhichOneof("record_type") != "history":
            continue
        items = {
            "/".join(i.nested_key) if i.nested_key else i.key: json.loads(i.value_json)
            for i in rec.history.item
        }
        step = int(rec.history.step.num)
        out[step] = {k: v for k, v in items.items() if not k.startswith("_")}
    return out


def test_cli_wandb_offline_and_tensorboard_log_the_metrics_rows(tiny, tmp_path, monkeypatch):
    """`claw-rl sft --wandb --tensorboard` with WANDB_MODE=offline: OUT/wandb holds an offline
    run (run-*.wandb with a run and an exit record) whose history is every number of each
    metrics.jsonl row at its step, and TensorBoard holds the same points."""
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for var, sub in (
        ("WANDB_CONFIG_DIR", "cfg"),
        ("WANDB_CACHE_DIR", "cache"),
        ("WANDB_DATA_DIR", "data"),
    ):
        monkeypatch.setenv(var, str(tmp_path / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    samples = _write(tmp_path / "s.jsonl", _rows())
    out = tmp_path / "run"
    r = CliRunner().invoke(
        main,
        ["sft", "--model", str(tiny), "--samples", str(samples), "-o", str(out),
         "--batch-size", "1", "--lr", "1e-3", "--wandb", "--tensorboard"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    import wandb

    # the CLI's process would end here: wandb's service flushes the run file at exit (finish()
    # may return before it has written it); in this process, end the service as exit does
    wandb.teardown()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    want = {row["step"]: dict(scalars(row)) for row in rows}
    assert len(want) == 2 and all("learner/loss" in w for w in want.values())

    (run_file,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
    records = _wandb_records(run_file)
    kinds = {rec.WhichOneof("record_type") for rec in records}
    assert {"run", "history", "exit"} <= kinds  # a whole run: started, logged, finished
    got = _history(records)
    assert set(got) == set(want)
    for step, w in want.items():
        assert set(got[step]) == set(w)
        assert got[step] == pytest.approx(w)

    board = EventAccumulator(str(out / "tensorboard"))
    board.Reload()
    assert set(board.Tags()["scalars"]) == set(want[0])
    loss = [(e.step, e.value) for e in board.Scalars("learner/loss")]
    assert loss == [(s, pytest.approx(w["learner/loss"])) for s, w in sorted(want.items())]


def test_wandb_without_the_extra_says_what_to_install(monkeypatch, tmp_path):
    """No wandb package: a ClawError naming the extra."""
    import sys

    from claw_rl.errors import ClawError
    from claw_rl.tracking import WandB

    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ClawError, match=r"claw-rl\[wandb\]"):
        WandB(tmp_path)
