"""One training step and the run directory it writes, shared by ``claw-rl train``, ``claw-rl sft``
and ``examples/mix_harness_rl.py``.

    learner = resume(run, algo="grpo") or Learner.grpo(config, model_dir)
    for k in range(len(completed_steps(run)), n_steps):
        row, policy = train_step(learner, samples_of(k), run, k, extra={"reward": ...})

Asynchronous rollouts: :func:`schedule` starts the rollouts of the next S steps before step k
trains, so they run while the learner works (on the policy in force). :func:`mark_step_start` and
:func:`step_records` let each step read only what it appended to a growing record file (the
proxy's calls.jsonl), so the per-step cost does not grow with the run.

The run directory (every writer of a training run uses this layout):

    metrics.jsonl     one row per completed step, in order: {"step": k (from 0), "policy_version",
                      the caller's fields, "time": {phase: seconds}, "seconds" (their sum),
                      the HEADLINE learner metrics, "learner": all learner metrics}; step k is
                      done once its row is here
    policies.jsonl    the claw.policy/v1 record in force after each completed step (row k of it
                      belongs to row k of metrics.jsonl)
    policy/v<N>/      HF directory of policy version N
    checkpoints/<k>/  learner state after k completed steps (4 digits; the last two are kept)

A step writes its policy, then checkpoint k+1, then the two rows. A process killed anywhere in
between leaves step k not done: :func:`resume` loads checkpoint k (the rows say k steps are done),
drops a policies.jsonl row without its metrics row, and the rerun of step k overwrites what the
killed one left (policy directory, checkpoint k+1). Under torchrun every rank calls these; rank 0
writes the rows.

The learner in a job of its own (``claw-rl follow RUN``, e.g. torchrun over several nodes) meets
the loop only through the run directory on a shared filesystem: the loop publishes step k's batch
(:func:`publish_batch`: ``steps/<k>/samples.jsonl``, then the marker ``steps/<k>/batch.json``),
the learner waits for it (:func:`wait_batch`) and runs :func:`train_step` on it (:func:`follow`),
and the loop waits for step k's rows (:func:`wait_trained`), or for ``steps/<k>/learner-error``,
which the learner writes when it fails (:func:`report_learner_error`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path

from claw_rl.checkpoint import load_checkpoint, save_checkpoint, save_policy
from claw_rl.errors import BatchError, LearnerFailed, WaitTimeout
from claw_rl.learner import Learner
from claw_rl.records import Sample

log = logging.getLogger("claw_rl")
KEEP_CHECKPOINTS = 2
# learner metrics repeated at the top of a metrics row (all of them are under "learner")
HEADLINE = (
    "loss",
    "mismatch_mean_abs",
    "mismatch_max_abs",
    "clip_frac",
    "approx_kl",
    "tokens_per_s",
    "staleness_max",
    "dropped_stale",
    "no_signal",
    "skipped",
    "tree_ratio",
)


def read_rows(path: str | Path) -> list[dict]:
    """The rows of a JSONL file; a last line cut off by a crash (no newline yet) is not one."""
    p = Path(path)
    if not p.exists():
        return []
    text = p.read_text()
    text = text[: text.rfind("\n") + 1]
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def append_rows(path: str | Path, rows: Sequence[dict]) -> None:
    """Append rows as JSONL and fsync: a row is either whole on disk or absent, and a last line
    cut off by a crash is dropped first."""
    p = Path(path)
    with p.open("a+b") as f:
        if f.seek(0, os.SEEK_END) and (f.seek(-1, os.SEEK_END), f.read(1))[1] != b"\n":
            f.seek(0)  # a line cut off by a crash (read_rows skips it): drop it
            f.truncate(f.read().rfind(b"\n") + 1)
        for row in rows:
            f.write((json.dumps(row) + "\n").encode())
        f.flush()
        os.fsync(f.fileno())


def completed_steps(run: str | Path) -> list[dict]:
    """The metrics rows of the completed steps (``run/metrics.jsonl``)."""
    return read_rows(Path(run) / "metrics.jsonl")


def policy_dir(run: str | Path, version: int) -> Path:
    return Path(run) / "policy" / f"v{version}"


def checkpoint_dir(run: str | Path, steps_done: int) -> Path:
    return Path(run) / "checkpoints" / f"{steps_done:04d}"


def latest_policy(run: str | Path) -> dict | None:
    """The claw.policy/v1 record in force after the last completed step (None before any)."""
    done = len(completed_steps(run))
    policies = read_rows(Path(run) / "policies.jsonl")[:done]
    return policies[-1] if policies else None


def resume(run: str | Path, *, algo: str | None = None, device: str | None = None):
    """The learner after the run's completed steps, from their checkpoint (None before any step);
    a policies.jsonl row of a step that did not complete is dropped."""
    run = Path(run)
    done = drop_incomplete(run)
    if not done:
        return None
    return load_checkpoint(checkpoint_dir(run, done), algo=algo, device=device)


def drop_incomplete(run: str | Path) -> int:
    """Drop a policies.jsonl row of a step that did not complete; the completed steps' count.
    No collective (no checkpoint is loaded): under torchrun rank 0 alone calls it."""
    run = Path(run)
    done = len(completed_steps(run))
    policies_path = run / "policies.jsonl"
    policies = read_rows(policies_path)
    if len(policies) > done or (policies_path.exists() and not _ends_whole(policies_path)):
        tmp = policies_path.with_name(policies_path.name + ".tmp")
        tmp.write_text("".join(json.dumps(p) + "\n" for p in policies[:done]))
        tmp.replace(policies_path)
    return done


def _ends_whole(path: Path) -> bool:
    data = path.read_bytes()
    return not data or data.endswith(b"\n")


def train_step(
    learner: Learner,
    samples: Sequence[Sample | dict],
    run: str | Path,
    step: int,
    *,
    extra: dict | None = None,
    current: dict | None = None,
    keep: int = KEEP_CHECKPOINTS,
    write_policy: bool = True,
) -> tuple[dict, dict]:
    """Step ``step`` of the run: one learner update on ``samples`` (none: no update), the policy
    saved to ``policy/v<N>/``, checkpoint ``step + 1``, then its policies.jsonl and metrics.jsonl
    rows. ``extra``: the caller's fields for the metrics row (its ``time`` dict is merged with the
    phases timed here). ``current``: the policy record in force before this step, given again
    when the step changed no policy weight (no samples, or no learning signal: the learner
    skips its update, see :mod:`claw_rl.learner`), so no policy directory is written and the
    version stays (engines need not reload). Without ``current`` such a step writes the
    weights in force as ``policy/v<N>/`` at the learner's version. ``write_policy`` False
    (weights sent in memory, :mod:`claw_rl.transfer`; ``current`` given): the new version gets
    no directory, its record keeps ``current``'s path (config, tokenizer and the last written
    weights) and the caller sends the weights. Returns ``(metrics row, policy record)``."""
    run = Path(run)
    extra = dict(extra or {})
    times = dict(extra.pop("time", {}))
    t0 = time.monotonic()
    if samples:
        metrics = learner.step(samples)
    else:  # said, not silent: the row's no_signal is true like that of a step that learns nothing
        metrics = {"skipped": "no samples", "no_signal": True, "no_signal_reason": "no samples"}
        metrics["policy_updates"] = 0
        log.warning("claw-rl step %d: NO LEARNING SIGNAL: no samples; no update", step)
    t1 = time.monotonic()
    if learner.dirty and current is not None and not write_policy:
        from claw_rl.transfer import next_policy

        policy = next_policy(learner, current["path"])
    elif learner.dirty or current is None:
        out = policy_dir(run, learner.version + (1 if learner.dirty else 0))
        if learner.dirty and learner.rank == 0 and out.exists():  # left by a run killed here
            shutil.rmtree(out)
        policy = save_policy(learner, out)
    else:
        policy = dict(current)
    t2 = time.monotonic()
    # checkpoint k+1 first, then the rows that mark step k done (see the module docstring)
    save_checkpoint(learner, checkpoint_dir(run, step + 1))
    t3 = time.monotonic()
    times.update(
        train_s=round(t1 - t0, 3), save_policy_s=round(t2 - t1, 3), checkpoint_s=round(t3 - t2, 3)
    )
    row = {"step": step, "policy_version": policy["version"], **extra, "time": times}
    row["seconds"] = round(sum(times.values()), 2)
    row.update({k: metrics[k] for k in HEADLINE if k in metrics})
    row["learner"] = metrics
    if learner.rank == 0:
        append_rows(run / "policies.jsonl", [policy])
        append_rows(run / "metrics.jsonl", [row])
        for old in range(step + 1 - keep, -1, -1):
            d = checkpoint_dir(run, old)
            if not d.exists():
                break
            shutil.rmtree(d)
    return row, policy


__all__ = [
    "HEADLINE",
    "KEEP_CHECKPOINTS",
    "append_rows",
    "checkpoint_dir",
    "completed_steps",
    "follow",
    "latest_policy",
    "policy_dir",
    "publish_batch",
    "published_learner",
    "read_rows",
    "report_learner_error",
    "resume",
    "step_dir",
    "train_step",
    "wait_batch",
    "wait_trained",
]


def schedule(
    steps: range, max_staleness: int, launch: Callable[[int], Future]
) -> Iterator[tuple[int, float, object, list[int]]]:
    """The order of work of an RL loop with asynchronous rollouts: yields
    ``(step, started, outcomes, ahead)`` for each step of ``steps`` in turn.

    Before step k's outcomes are awaited, the rollouts of k and of the next S = ``max_staleness``
    steps are started, each once, with ``launch(j)``, which returns a Future of step j's
    outcomes. The caller trains on step k between two yields, so with S >= 1 the later steps'
    rollouts run meanwhile, on the policy in force: at most S versions behind when their step
    trains, since step j is launched only after step j - S - 1's update. S = 0 is the
    synchronous loop. ``started``: when step k's rollouts were launched (``time.monotonic()``);
    ``ahead``: the later steps whose rollouts are running. Leaving the loop early cancels the
    launches not yet running.
    """
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    pending: dict[int, tuple[float, Future]] = {}
    try:
        for step in steps:
            for j in range(step, min(step + max_staleness + 1, steps.stop)):
                if j not in pending:
                    pending[j] = (time.monotonic(), launch(j))
            started, future = pending.pop(step)
            yield step, started, future.result(), sorted(pending)
    finally:
        for _, future in pending.values():
            future.cancel()


def _offset_path(run: str | Path, step: int, name: str) -> Path:
    return step_dir(run, step) / f"{Path(name).stem}-offset.json"


def _read_offset(run: str | Path, step: int, name: str) -> dict:
    path = _offset_path(run, step, name)
    return json.loads(path.read_text()) if step >= 0 and path.exists() else {}


def _write_offset(run: str | Path, step: int, name: str, offset: dict) -> None:
    path = _offset_path(run, step, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(offset) + "\n")
    tmp.replace(path)  # whole or not at all


def mark_step_start(run: str | Path, step: int, name: str = "calls.jsonl") -> int:
    """Before step ``step``'s first record is appended to ``run/name``: remember where the file's
    last whole line ends (``steps/<k>/<stem>-offset.json``, ``{"start": byte}``; 0 when there is
    no file yet), since every record of the step comes after it. A mark already there is kept
    (a resumed step reads from where it first began). Returns the start."""
    start = _read_offset(run, step, name).get("start")
    if start is not None:
        return start
    size, tail = 0, b""
    with contextlib.suppress(FileNotFoundError), (Path(run) / name).open("rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - (1 << 20)))  # a record line is far shorter than 1 MiB
        tail = f.read()
    start = size - len(tail) + tail.rfind(b"\n") + 1
    _write_offset(run, step, name, {"start": start})
    return start


def step_records(run: str | Path, step: int, name: str = "calls.jsonl") -> str:
    """The whole lines of ``run/name`` from step ``step``'s start (its mark; without one, the end
    the previous step read, or 0) to the file's last whole line: a line still being written is
    not read. The range read is kept in the mark (``{"start", "end"}``), so a rerun of the step
    reads from the same start."""
    start = _read_offset(run, step, name).get("start")
    if start is None:
        start = _read_offset(run, step - 1, name).get("end", 0)
    with (Path(run) / name).open("rb") as f:
        f.seek(start)
        data = f.read()
    data = data[: data.rfind(b"\n") + 1]
    _write_offset(run, step, name, {"start": start, "end": start + len(data)})
    return data.decode()


# --- the learner in another job: a step's published batch, and the rows the loop waits for ------

BATCH_MARKER = "batch.json"
LEARNER_ERROR = "learner-error"


def step_dir(run: str | Path, step: int) -> Path:
    """``run/steps/<k>/`` (4 digits): the files of step ``step``."""
    return Path(run) / "steps" / f"{step:04d}"


def _write_whole(path: Path, text: str) -> None:
    """Write next to ``path``, then rename: a reader sees the old file or the new one, whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # one per process: ranks may race
    tmp.write_text(text)
    os.replace(tmp, path)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def publish_batch(
    run: str | Path,
    step: int,
    samples: Sequence[Sample | dict],
    extra: dict | None = None,
    learner: dict | None = None,
) -> Path:
    """Hand step ``step``'s batch to the learner: ``steps/<k>/samples.jsonl``, then the marker
    ``steps/<k>/batch.json`` = ``{"step", "samples": count, "sha256": of the samples file,
    "extra": the caller's fields for the metrics row, "learner": the learner config fields the
    caller wants trained with}``, each written whole (renamed into place), the marker last: once
    it is there, so is its batch. A rerun of the step removes the marker its first try left
    before it writes anything. Returns the marker's path."""
    d = step_dir(run, step)
    marker = d / BATCH_MARKER
    marker.unlink(missing_ok=True)
    rows = [s.to_dict() if isinstance(s, Sample) else s for s in samples]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    _write_whole(d / "samples.jsonl", text)
    body = {
        "step": step,
        "samples": len(rows),
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
        "extra": dict(extra or {}),
        "learner": dict(learner or {}),
    }
    _write_whole(marker, json.dumps(body) + "\n")
    return marker


def published_learner(run: str | Path, step: int, timeout: float) -> dict:
    """The learner config fields published with step ``step``'s batch (waits for it as
    :func:`wait_batch` does): what a follower starting on that step trains with."""
    return dict(_wait_marker(run, step, timeout, 0.5)[1].get("learner") or {})


def _marker_body(text: str, marker: Path) -> dict:
    """A batch marker's fields, checked: ``samples`` a count and ``sha256`` the samples file's
    digest (64 hex digits) are required, so no batch trains unchecked."""
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BatchError(f"{marker}: not a JSON batch marker ({exc})") from None
    if not isinstance(body, dict):
        raise BatchError(f"{marker}: a batch marker is a JSON object, got {type(body).__name__}")
    count = body.get("samples")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise BatchError(
            f"{marker}: field 'samples' must be the batch's sample count, got {count!r}"
        )
    digest = body.get("sha256")
    if not (
        isinstance(digest, str) and len(digest) == 64 and set(digest) <= set("0123456789abcdef")
    ):
        raise BatchError(
            f"{marker}: field 'sha256' (the samples file's digest, 64 lowercase hex digits) is "
            f"required, got {digest!r}; publish batches with claw_rl.loop.publish_batch"
        )
    for key in ("extra", "learner"):
        if not isinstance(body.get(key, {}), dict):
            raise BatchError(f"{marker}: field {key!r} must be an object, got {body[key]!r}")
    return body


def _batch_mismatch(body: dict, samples_path: Path) -> tuple[list[dict], str | None]:
    """The samples of ``samples_path`` and what in it disagrees with its marker ``body``."""
    data = samples_path.read_bytes() if samples_path.exists() else None
    if data is None:
        return [], f"missing; its marker says {body['samples']} samples"
    rows = [json.loads(x) for x in data.decode().splitlines() if x.strip()]
    if len(rows) != body["samples"]:
        return rows, f"has {len(rows)} samples; its marker says {body['samples']}"
    if hashlib.sha256(data).hexdigest() != body["sha256"]:
        return rows, "is not the file its marker was written for (sha256 differs)"
    return rows, None


def wait_batch(
    run: str | Path, step: int, timeout: float, *, poll: float = 0.5
) -> tuple[list[dict], dict]:
    """Step ``step``'s batch once :func:`publish_batch` has published it: ``(samples, extra)``.

    Polls for the marker every ``poll`` s; none after ``timeout`` s is a :class:`WaitTimeout`.
    A marker without its ``samples`` count or ``sha256`` is a :class:`BatchError` naming the
    marker and the field; a samples file whose count or sha256 disagrees with its marker is a
    :class:`BatchError` naming the file, unless the marker changed meanwhile (a rerun of the step republished
    it): then the new one is read. Takes no collective, so under torchrun every rank waits
    and reads on its own, however long the rollouts take."""
    rows, body = _wait_marker(run, step, timeout, poll)
    return rows, body.get("extra", {})


def _wait_marker(run: str | Path, step: int, timeout: float, poll: float) -> tuple[list, dict]:
    """:func:`wait_batch`'s wait: the step's samples and its whole marker."""
    d = step_dir(run, step)
    marker, path = d / BATCH_MARKER, d / "samples.jsonl"
    deadline = time.monotonic() + timeout
    while True:
        seen = _read_text(marker)
        if seen is not None:
            body = _marker_body(seen, marker)
            rows, problem = _batch_mismatch(body, path)
            if problem is None:
                return rows, body
            if _read_text(marker) == seen:
                raise BatchError(f"{path}: {problem} ({marker})")
            continue
        if time.monotonic() >= deadline:
            raise WaitTimeout(
                f"{marker}: no batch for step {step} after {timeout:g} s; is the loop running "
                "on this run directory (examples/mix_harness_rl.py --learner follow)?"
            )
        time.sleep(poll)


def report_learner_error(run: str | Path, step: int, text: str) -> Path:
    """Write ``steps/<k>/learner-error`` (whole): the learner failed on step ``step``, and the
    loop waiting for it (:func:`wait_trained`) stops with ``text``."""
    path = step_dir(run, step) / LEARNER_ERROR
    _write_whole(path, text.rstrip("\n") + "\n")
    return path


def wait_trained(
    run: str | Path, step: int, timeout: float, *, poll: float = 0.5
) -> tuple[dict, dict]:
    """``(metrics row, policy record)`` of step ``step`` once the learner in another job has
    written them (:func:`follow`). A ``steps/<k>/learner-error`` file is a
    :class:`LearnerFailed` with its text; no row after ``timeout`` s is a :class:`WaitTimeout`."""
    run = Path(run)
    error = step_dir(run, step) / LEARNER_ERROR
    deadline = time.monotonic() + timeout
    while True:
        rows = completed_steps(run)
        if len(rows) > step:  # the policies row is appended before the metrics row
            return rows[step], read_rows(run / "policies.jsonl")[step]
        if (text := _read_text(error)) is not None:
            raise LearnerFailed(f"{error}: the learner failed on step {step}: {text.strip()}")
        if time.monotonic() >= deadline:
            raise WaitTimeout(
                f"step {step}: no row in {run / 'metrics.jsonl'} after {timeout:g} s; is "
                f"`claw-rl follow {run} --steps N ...` running on this run directory?"
            )
        time.sleep(poll)


def follow(
    learner: Learner,
    run: str | Path,
    steps: range,
    *,
    timeout: float,
    current: dict | None = None,
    poll: float = 0.5,
) -> Iterator[tuple[dict, dict]]:
    """The learner's side of :func:`publish_batch`: for each step of ``steps``, wait for its
    batch (:func:`wait_batch`, up to ``timeout`` s) and :func:`train_step` on it with the
    loop's ``extra`` fields; yields ``(metrics row, policy record)``. ``current``: the policy
    record in force before the first step. A failure is written to ``steps/<k>/learner-error``
    (the loop's :func:`wait_trained` stops on it), then raised."""
    for k in steps:
        try:
            samples, extra = wait_batch(run, k, timeout, poll=poll)
            row, current = train_step(learner, samples, run, k, extra=extra, current=current)
        except Exception as exc:
            report_learner_error(run, k, f"rank {learner.rank}: {type(exc).__name__}: {exc}")
            raise
        yield row, current
