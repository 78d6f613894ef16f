"""claw_rl.loop: one step's records in the run directory, and resuming after a kill mid-step."""

from __future__ import annotations

import json
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from claw_rl import BatchError, ClawError, GRPOConfig, Learner, LearnerFailed, WaitTimeout, loop
from rl_testlib import tree_sample
from safetensors.torch import load_file


def _batch(vocab: int, seed: int) -> list[dict]:
    return [
        tree_sample([-1, 0, 1, 2, 3], [0, 0, 1, 1, 1], seed=seed + k, vocab=vocab, sample_id=f"{k}")
        for k in range(2)
    ]


def test_steps_write_the_layout_and_keep_two_checkpoints(tiny, tmp_path):
    """Three steps: rows 0-2 with the caller's fields and phase times, policy/v1-v3, checkpoints
    2 and 3 only; a step without samples keeps the policy in force."""
    learner = Learner.grpo(GRPOConfig(lr=1e-3), tiny)
    vocab = learner.policy.config.vocab_size
    current = None
    for k in range(3):
        row, current = loop.train_step(
            learner, _batch(vocab, k), tmp_path, k, extra={"reward": k, "time": {"rollout_s": 1}}
        )
        assert row["reward"] == k and row["time"]["rollout_s"] == 1 and "train_s" in row["time"]
    row, policy = loop.train_step(learner, [], tmp_path, 3, current=current)
    assert policy == current and row["learner"]["skipped"] == "no samples"
    assert row["no_signal"] is True and row["learner"]["no_signal_reason"] == "no samples"
    rows = loop.completed_steps(tmp_path)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert [r["policy_version"] for r in rows] == [1, 2, 3, 3]
    assert [p["version"] for p in loop.read_rows(tmp_path / "policies.jsonl")] == [1, 2, 3, 3]
    assert all((loop.policy_dir(tmp_path, v) / "model.safetensors").exists() for v in (1, 2, 3))
    assert sorted(d.name for d in (tmp_path / "checkpoints").iterdir()) == ["0003", "0004"]


def test_a_step_cut_off_before_its_rows_is_redone_from_the_previous_checkpoint(tiny, tmp_path):
    """Killed after policy v2 and checkpoint 2 but before step 1's rows (one half-written):
    resume() loads checkpoint 1 and drops the orphan policies row; redoing step 1 gives the
    weights of an uninterrupted run."""
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    learner = Learner.grpo(GRPOConfig(lr=1e-3), tiny)
    vocab = learner.policy.config.vocab_size
    for k in range(2):
        loop.train_step(learner, _batch(vocab, k), straight, k)
    learner = Learner.grpo(GRPOConfig(lr=1e-3), tiny)
    for k in range(2):
        loop.train_step(learner, _batch(vocab, k), cut, k)
    metrics = (cut / "metrics.jsonl").read_text().splitlines(keepends=True)
    (cut / "metrics.jsonl").write_text(metrics[0] + metrics[1][:20])  # the kill, mid-write
    resumed = loop.resume(cut, algo="grpo")
    assert resumed.version == 1 and resumed.step_count == 1
    assert [p["version"] for p in loop.read_rows(cut / "policies.jsonl")] == [1]
    loop.train_step(resumed, _batch(vocab, 1), cut, 1, current=loop.latest_policy(cut))
    rows = [json.loads(x) for x in (cut / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    a = load_file(loop.policy_dir(straight, 2) / "model.safetensors")
    b = load_file(loop.policy_dir(cut, 2) / "model.safetensors")
    assert max(float((a[n] - b[n]).abs().max()) for n in a) == 0.0
    assert loop.resume(tmp_path / "empty") is None


def _launches(max_staleness: int, steps: range) -> list[tuple]:
    """The schedule's events: ("launch", j) as it starts step j, ("train", k, ahead) per yield."""
    events: list[tuple] = []

    def launch(j: int) -> Future:
        events.append(("launch", j))
        done: Future = Future()
        done.set_result([f"outcome of {j}"])
        return done

    for step, started, outcomes, ahead in loop.schedule(steps, max_staleness, launch):
        assert outcomes == [f"outcome of {step}"] and started > 0
        events.append(("train", step, ahead))
    return events


def test_schedule_synchronous_launches_each_step_before_it_trains():
    """S = 0: launch k, train k, launch k + 1 ...; nothing runs ahead."""
    assert _launches(0, range(3)) == [
        ("launch", 0), ("train", 0, []), ("launch", 1), ("train", 1, []),
        ("launch", 2), ("train", 2, []),
    ]  # fmt: skip


def test_schedule_runs_s_steps_ahead_each_launched_once_within_the_range():
    """S = 2 from a resumed step 1 of 5: steps 1-3 start before step 1 trains, then one more
    per step, never past the range's end, each exactly once."""
    events = _launches(2, range(1, 5))
    assert events == [
        ("launch", 1), ("launch", 2), ("launch", 3), ("train", 1, [2, 3]),
        ("launch", 4), ("train", 2, [3, 4]), ("train", 3, [4]), ("train", 4, []),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="max_staleness must be >= 0, got -1"):
        list(loop.schedule(range(2), -1, lambda j: Future()))


def test_schedule_cancels_pending_launches_when_the_loop_stops():
    """Breaking out of the loop cancels the futures of the steps launched ahead."""
    futures: dict[int, Future] = {}

    def launch(j: int) -> Future:
        futures[j] = Future()
        if j == 0:
            futures[j].set_result([])
        return futures[j]

    for _ in loop.schedule(range(3), 2, launch):
        break
    assert futures[1].cancelled() and futures[2].cancelled()


def test_each_step_reads_only_the_whole_lines_appended_since_its_start(tmp_path):
    """mark_step_start remembers where the file's last whole line ends (0 without a file, kept
    once written); step_records reads from there to the last whole line (a line cut off is read
    by the next step), a step without a mark starts where the previous one ended, and a rerun of
    a step reads the same lines again."""
    path = tmp_path / "calls.jsonl"
    assert loop.mark_step_start(tmp_path, 0) == 0
    path.write_text('{"a": 0}\n{"a": 1}\n{"a": 2')  # a line still being written
    assert loop.mark_step_start(tmp_path, 0) == 0  # kept
    assert loop.step_records(tmp_path, 0) == '{"a": 0}\n{"a": 1}\n'
    assert loop.mark_step_start(tmp_path, 1) == len('{"a": 0}\n{"a": 1}\n')
    with path.open("a") as f:
        f.write('}\n{"a": 3}\n')
    assert loop.step_records(tmp_path, 1) == '{"a": 2}\n{"a": 3}\n'
    assert loop.step_records(tmp_path, 1) == '{"a": 2}\n{"a": 3}\n'  # a rerun: the same
    mark = json.loads((tmp_path / "steps" / "0001" / "calls-offset.json").read_text())
    assert mark == {"start": 18, "end": path.stat().st_size}
    with path.open("a") as f:
        f.write('{"a": 4}\n')
    assert loop.step_records(tmp_path, 2) == '{"a": 4}\n'  # no mark: from step 1's end
    assert loop.step_records(tmp_path, 0, "calls.jsonl").startswith('{"a": 0}')


# --- a learner in another job: publish_batch / wait_batch / wait_trained / follow ----------------


def test_a_published_batch_reads_back_whole_with_the_loops_fields(tmp_path, monkeypatch):
    """publish_batch renames samples.jsonl into place, then the marker (never written in place,
    no temporary file left); a wait begun before the publish returns the samples (Sample objects
    as their dicts) and the extra fields; a rerun of the step removes the old marker first."""
    from claw_rl import Sample

    rows = _batch(1000, 0)
    replaced: list[str] = []
    real_replace = loop.os.replace
    monkeypatch.setattr(
        loop.os, "replace", lambda a, b: (replaced.append(Path(b).name), real_replace(a, b))
    )
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(loop.wait_batch, tmp_path, 3, 30, poll=0.01)
        time.sleep(0.05)
        assert not waiting.done()
        marker = loop.publish_batch(
            tmp_path, 3, [Sample.from_dict(rows[0]), rows[1]], {"reward": 0.5, "time": {"a": 1}}
        )
        samples, extra = waiting.result(timeout=30)
    assert replaced == ["samples.jsonl", "batch.json"] and marker.name == "batch.json"
    assert extra == {"reward": 0.5, "time": {"a": 1}}
    assert [s["sample_id"] for s in samples] == ["0", "1"] and samples[1] == rows[1]
    assert samples[0]["input_ids"] == rows[0]["input_ids"]
    assert json.loads(marker.read_text())["samples"] == 2
    assert sorted(p.name for p in marker.parent.iterdir()) == ["batch.json", "samples.jsonl"]
    monkeypatch.setattr(loop, "_write_whole", lambda path, text: replaced.append(path.exists()))
    loop.publish_batch(tmp_path, 3, rows[:1])  # a rerun, its writes recorded instead of done
    assert replaced[2:] == [True, False]  # samples.jsonl was there, the marker was gone


def test_a_batch_that_disagrees_with_its_marker_is_an_error_naming_the_file(tmp_path):
    """A samples file with another count than its marker's, or other contents, or none, is a
    BatchError naming the file."""
    rows = _batch(1000, 0)
    loop.publish_batch(tmp_path, 0, rows)
    path = tmp_path / "steps" / "0000" / "samples.jsonl"
    with path.open("a") as f:
        f.write(json.dumps(rows[0]) + "\n")
    with pytest.raises(BatchError, match=f"{path}: has 3 samples; its marker says 2"):
        loop.wait_batch(tmp_path, 0, 5)
    path.write_text(json.dumps(rows[1]) + "\n" + json.dumps(rows[0]) + "\n")
    with pytest.raises(BatchError, match="sha256 differs"):
        loop.wait_batch(tmp_path, 0, 5)
    path.unlink()
    with pytest.raises(BatchError, match=f"{path}: missing; its marker says 2"):
        loop.wait_batch(tmp_path, 0, 5)


def test_waits_that_get_nothing_time_out_and_a_learner_error_stops_the_loop(tmp_path):
    """No batch: WaitTimeout naming the marker and the loop's option; no row: WaitTimeout naming
    claw-rl follow; a learner-error file: LearnerFailed with its text at once."""
    t0 = time.monotonic()
    with pytest.raises(
        WaitTimeout, match=r"steps/0002/batch.json: no batch for step 2 after 0.2 s"
    ):
        loop.wait_batch(tmp_path, 2, 0.2, poll=0.05)
    assert 0.2 <= time.monotonic() - t0 < 10
    with pytest.raises(WaitTimeout, match=r"step 0: no row in .*metrics.jsonl.*claw-rl follow"):
        loop.wait_trained(tmp_path, 0, 0.1, poll=0.05)
    loop.report_learner_error(tmp_path, 0, "rank 1: ClawError: out of memory")
    t0 = time.monotonic()
    with pytest.raises(LearnerFailed, match="failed on step 0: rank 1: ClawError: out of memory"):
        loop.wait_trained(tmp_path, 0, 600)
    assert time.monotonic() - t0 < 10


def test_follow_trains_each_published_batch_and_reports_a_failure(tiny, tmp_path):
    """follow() trains steps 0 and 1 as their batches come (rows with the loop's fields; the
    loop's wait_trained returns them); a batch the learner refuses is written to
    steps/0002/learner-error, which wait_trained raises."""
    learner = Learner.grpo(GRPOConfig(lr=1e-3), tiny)
    vocab = learner.policy.config.vocab_size
    steps = loop.follow(learner, tmp_path, range(3), timeout=60, poll=0.01)
    for k in range(2):
        loop.publish_batch(tmp_path, k, _batch(vocab, k), {"reward": k})
        row, policy = next(steps)
        assert (row["step"], row["reward"], policy["version"]) == (k, k, k + 1)
        assert loop.wait_trained(tmp_path, k, 1) == (row, policy)
    assert row["learner"]["world_size"] == 1
    loop.publish_batch(tmp_path, 2, [{**_batch(vocab, 2)[0], "algo": "sft"}])
    with pytest.raises(ClawError, match="has algo 'sft'"):
        next(steps)
    with pytest.raises(LearnerFailed, match="step 2: rank 0: ClawError: sample '0' has algo"):
        loop.wait_trained(tmp_path, 2, 60)
