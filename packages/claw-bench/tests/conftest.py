"""Fixtures for the claw-bench tests; the test-only job runner and scripted model server live
in bench_testlib.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_testlib import (
    SECRET,
)


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    p = tmp_path / "secret.txt"
    p.write_text(SECRET.decode() + "\n")
    return p
