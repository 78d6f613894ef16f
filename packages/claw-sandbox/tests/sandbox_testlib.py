"""Shared helpers for the claw-sandbox tests: job builders and process probes."""

import os
import sys
from pathlib import Path

FORMATS = Path(__file__).resolve().parents[3] / "formats"


def job(job_id="j", command="true", **fields) -> dict:
    """A claw.job/v1 dict with the given fields."""
    return {"schema": "claw.job/v1", "job_id": job_id, "command": command, **fields}


def py(code: str) -> list[str]:
    """A command running `code` with this interpreter (visible read-only inside bwrap)."""
    return [sys.executable, "-c", code]


def running_argv(argv: list[str]) -> list[int]:
    """Pids whose argv is exactly `argv` (the program name compared by its basename)."""
    want = [os.path.basename(argv[0]).encode(), *(a.encode() for a in argv[1:])]
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    got = f.read().rstrip(b"\0").split(b"\0")
            except OSError:
                continue
            if got and [os.path.basename(got[0]), *got[1:]] == want:
                found.append(int(entry.name))
    return found


def alive_with(token: str) -> list[int]:
    """Pids whose command line (arguments joined by spaces) contains token."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    if token.encode() in f.read().replace(b"\0", b" "):
                        found.append(int(entry.name))
            except OSError:
                pass
    return found
