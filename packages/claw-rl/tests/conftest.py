"""Shared fixtures: one tiny model per test session (hand-built tree samples live in
rl_testlib.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from claw_rl import init_tiny


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> Path:
    """A tiny random Qwen3 model directory (built locally, no hub)."""
    return init_tiny(tmp_path_factory.mktemp("models") / "tiny")
