"""The rubric judge's answers cache: one JSONL file, one line per answered criterion.

A line is ``{"key", "criterion", "model", "verdict", "score", "reason", "call_id"}``; ``key`` is
:func:`cache_key` of the criterion's text and scale, the evidence digest (over each file, name and
the final message as one JSON value, so two evidences never share it), the prompt's fingerprint
(its system message and evidence layout) and the judge model, so scoring the same runs again asks
the judge nothing it already answered, and an answer given to another prompt is never reused. Only parsed answers are
written (never an infrastructure error). A line that is not a JSON object with a string ``key``
is an error naming the file and line: the cache is never silently half-read.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import attrs

from claw_bench.errors import ClawError


def cache_key(*, text: str, scale: str, evidence_digest: str, prompt: str, model: str) -> str:
    """sha256 over the criterion (text, scale), the evidence digest, the prompt's fingerprint and
    the judge model."""
    blob = json.dumps([text, scale, evidence_digest, prompt, model], ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@attrs.define
class JudgeCache:
    """Answers by key, read from ``path`` once (when it exists) and appended to as they come."""

    path: Path = attrs.field(converter=Path)
    _answers: dict[str, dict[str, Any]] | None = attrs.field(default=None, init=False)

    def _load(self) -> dict[str, dict[str, Any]]:
        if self._answers is None:
            self._answers = {}
            if self.path.is_file():
                with self.path.open(encoding="utf-8") as fh:
                    for n, line in enumerate(fh, start=1):
                        if not line.strip():
                            continue
                        try:
                            row = json.loads(line)
                        except json.JSONDecodeError as exc:
                            raise ClawError(
                                f"{self.path}:{n}: judge cache line is not JSON: {exc}"
                            ) from exc
                        if not isinstance(row, dict) or not isinstance(row.get("key"), str):
                            raise ClawError(
                                f"{self.path}:{n}: judge cache line needs a string 'key'"
                            )
                        self._answers[row["key"]] = row
        return self._answers

    def get(self, key: str) -> dict[str, Any] | None:
        """The cached answer of ``key``, or None."""
        return self._load().get(key)

    def put(self, row: dict[str, Any]) -> None:
        """Remember ``row`` (it carries its ``key``) and append it to the file."""
        self._load()[row["key"]] = row
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")

    def __len__(self) -> int:
        return len(self._load())
