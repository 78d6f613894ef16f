"""collect is bounded: file and byte caps, no link is followed (loops cost nothing), it stops on
request, and SIGTERM stops a runner in the middle of one (a second SIGTERM, one stuck anywhere)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

from claw_sandbox import run_jobs
from claw_sandbox.workspace import collect
from sandbox_testlib import job


def _files(root, n, size=10, name="f{}.txt"):
    for i in range(n):
        (root / name.format(i)).write_bytes(b"x" * size)


def test_symlink_loops_are_not_followed(tmp_path):
    """`ln -s . a; ln -s . b` with `**/*.txt` returns the real files at once, each once."""
    (tmp_path / "d").mkdir()
    (tmp_path / "x.txt").write_text("x")
    (tmp_path / "d" / "y.txt").write_text("y")
    (tmp_path / "a").symlink_to(".")
    (tmp_path / "b").symlink_to(".")
    (tmp_path / "d" / "up").symlink_to("..")
    assert collect(tmp_path, ["**/*.txt"]) == ({"d/y.txt": "y", "x.txt": "x"}, None)


def test_file_cap_keeps_the_first_files_and_says_so(tmp_path):
    """Over `max_files` matches: the first ones (pattern order, then path order) and a note."""
    _files(tmp_path, 5)
    got, note = collect(tmp_path, ["*.txt"], max_files=3)
    assert list(got) == ["f0.txt", "f1.txt", "f2.txt"]
    assert "collect_files=3" in note and "2 more" in note


def test_byte_cap_bounds_the_total_and_cuts_the_last_file(tmp_path):
    """The bytes returned never exceed `max_bytes`; the file reaching the cap is cut."""
    _files(tmp_path, 4, size=1000)
    got, note = collect(tmp_path, ["*.txt"], max_bytes=2500)
    assert sum(len(v) for v in got.values()) == 2500
    assert got["f2.txt"] == "x" * 500 and "f3.txt" not in got
    assert "collect_bytes=2500" in note and "f2.txt cut" in note


def test_byte_cap_counts_the_text_as_the_record_holds_it(tmp_path):
    """Control bytes take 6 bytes each as JSON escapes: the cap bounds that size, not the raw."""
    (tmp_path / "ctl.bin").write_bytes(b"\x01" * 1000)
    (tmp_path / "bad.bin").write_bytes(b"\xff" * 1000)
    got, note = collect(tmp_path, ["*.bin"], max_bytes=3000)
    assert len(json.dumps(got["bad.bin"], ensure_ascii=False).encode()) - 2 == 3000
    assert list(got) == ["bad.bin"] and "collect_bytes=3000" in note
    got, note = collect(tmp_path, ["ctl.bin"], max_bytes=3000)
    assert got == {"ctl.bin": "\x01" * 500} and "ctl.bin cut" in note


def test_pattern_order_then_path_order_and_one_entry_per_file(tmp_path):
    """A file matched by two globs appears once, where its first glob puts it."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "b.log").write_text("b")
    (tmp_path / "a.txt").write_text("a")
    got, note = collect(tmp_path, ["out/*.log", "**"])
    assert list(got) == ["out/b.log", "a.txt"] and note is None


def test_a_set_stop_event_ends_collect(tmp_path):
    """The runner shutting down sets the event: collect returns nothing, with a note."""
    _files(tmp_path, 3)
    stop = threading.Event()
    stop.set()
    got = collect(tmp_path, ["*"], stop=stop)
    assert got == ({}, "collect: interrupted (the runner is stopping)")


def test_job_with_many_big_files_gets_a_bounded_run_line(process, tmp_path):
    """200 files of 64 KiB of random bytes with collect_bytes=100000: the collected texts take
    100000 bytes in the run line, and the cap is named in the run's error."""
    row = job(
        "big",
        command="for i in $(seq 200); do head -c 65536 /dev/urandom > f$i.txt; done",
        collect=["*.txt"],
        limits={"collect_bytes": 100000},
    )
    (run,) = run_jobs([row], backend=process, workdir=tmp_path / "w")
    assert run["status"] == "ok", run
    texts = run["collected"].values()
    size = sum(len(json.dumps(t, ensure_ascii=False).encode()) - 2 for t in texts)
    assert 100000 - 6 < size <= 100000  # a cut never splits a character or its escape
    assert "collect_bytes=100000" in run["error"]
    assert len(json.dumps(run, ensure_ascii=False).encode()) < 110000


RUNNER = textwrap.dedent(
    """
    import os, sys, time
    from claw_sandbox import _fsat, cli

    walk = _fsat.walk

    def slow_walk(root_fd, descend):  # a collect that would take ~100 s
        for i, entry in enumerate(walk(root_fd, descend)):
            if i == 0:
                open(os.environ["COLLECT_STARTED"], "w").close()
            time.sleep(0.1)
            yield entry

    _fsat.walk = slow_walk
    sys.argv[0] = "claw-sandbox"
    cli.main()
    """
)


def test_sigterm_stops_a_runner_in_the_middle_of_collect(tmp_path):
    """SIGTERM during a slow collect: the runner exits (130) without finishing the walk, and
    the job directory is removed."""
    jobs = tmp_path / "jobs.jsonl"
    row = job("slow", command="for i in $(seq 1000); do : > f$i.txt; done", collect=["*.txt"])
    jobs.write_text(json.dumps(row) + "\n")
    started = tmp_path / "collect-started"
    workdir = tmp_path / "w"
    proc = subprocess.Popen(
        [sys.executable, "-c", RUNNER, "run", str(jobs), "-o", str(tmp_path / "runs.jsonl"),
         "--backend", "process", "--workdir", str(workdir)],
        env={**os.environ, "COLLECT_STARTED": str(started)},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        for _ in range(600):
            if started.exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert started.exists(), proc.stderr.read() if proc.poll() is not None else "no collect"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)  # the walk alone would take ~100 s
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert os.listdir(workdir) == []


STUCK_CLEANUP = textwrap.dedent(
    """
    import os, sys, time
    from claw_sandbox import cli
    from claw_sandbox.backends import base

    def stuck_remove(self):  # a cleanup that never ends
        open(os.environ["CLEANUP_STARTED"], "w").close()
        while True:
            time.sleep(1)

    base.Sandbox.remove = stuck_remove
    sys.argv[0] = "claw-sandbox"
    cli.main()
    """
)


def test_a_second_sigterm_ends_a_runner_stuck_in_cleanup(tmp_path):
    """The first SIGTERM starts the cleanup; if that hangs, a second SIGTERM ends the runner."""
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps(job("stuck", command="touch left; sleep 300")) + "\n")
    started = tmp_path / "cleanup-started"
    proc = subprocess.Popen(
        [sys.executable, "-c", STUCK_CLEANUP, "run", str(jobs), "--backend", "process",
         "--workdir", str(tmp_path / "w")],
        env={**os.environ, "CLEANUP_STARTED": str(started)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for _ in range(600):  # the job is running once its workspace holds `left`
            if list((tmp_path / "w").glob("*/ws/left")) or proc.poll() is not None:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        for _ in range(600):
            if started.exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert started.exists() and proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
