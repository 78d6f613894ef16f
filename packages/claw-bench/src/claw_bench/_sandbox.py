"""Finding the `claw-sandbox` command, which claw-bench drives over JSONL (it never imports it)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def sandbox_executable(program: str = "claw-sandbox") -> str | None:
    """``program`` on PATH, else next to this interpreter (a venv's bin/ that is not activated);
    None when neither holds it."""
    exe = shutil.which(program) or str(Path(sys.executable).parent / program)
    return exe if os.access(exe, os.X_OK) else None
