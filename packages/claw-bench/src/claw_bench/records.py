"""JSONL reading and writing of plain-dict records, with file:line errors.

Reader kind (docs/formats.md, Readers; held to formats/conformance by tests/test_conformance.py):
`iter_records` is a *projection*: it checks the line (a JSON object, no ``NaN`` / ``Infinity``)
and its ``schema``, skips blank lines and leaves every other field to the code that reads it
(`score_run` for runs, `report` for outcomes, the transcript loader for calls).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from claw_bench.errors import RecordError

JOB = "claw.job/v1"
RUN = "claw.run/v1"
OUTCOME = "claw.outcome/v1"


def _open_in(path: str | Path) -> tuple[IO[str], str, bool]:
    if str(path) == "-":
        return sys.stdin, "<stdin>", False
    p = Path(path)
    try:
        return p.open(encoding="utf-8"), str(p), True
    except OSError as exc:
        raise RecordError(f"{p}: cannot open: {exc.strerror}") from exc


def iter_records(
    path: str | Path, schema: str, check: Callable[[dict[str, Any], str], None] | None = None
) -> Iterator[dict[str, Any]]:
    """Yield each record of a JSONL file (``-`` = stdin) checking its ``schema`` field.

    Blank lines are skipped. A line that is not a JSON object, or whose schema is missing, of
    another record type or of another major version, raises RecordError naming file:line.
    ``check(row, where)`` (e.g. `score.check_run`, `report.check_outcome`) validates the fields
    the caller reads, with the same file:line.
    """
    fh, name, close = _open_in(path)
    try:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            row = parse_record(line, schema, f"{name}:{lineno}")
            if check is not None:
                check(row, f"{name}:{lineno}")
            yield row
    finally:
        if close:
            fh.close()


def _not_json(word: str) -> Any:
    raise ValueError(f"{word} is not a JSON number")


def parse_record(line: str, schema: str, where: str) -> dict[str, Any]:
    """Parse one JSONL line into a dict of the given schema; errors name ``where``."""
    try:
        row = json.loads(line, parse_constant=_not_json)
    except json.JSONDecodeError as exc:
        raise RecordError(f"{where}: not JSON: {exc.msg} (column {exc.colno})") from exc
    except ValueError as exc:
        raise RecordError(f"{where}: not JSON: {exc}") from exc
    if not isinstance(row, dict):
        raise RecordError(f"{where}: expected a JSON object, got {type(row).__name__}")
    got = row.get("schema")
    if got != schema:
        name, _, _ = schema.partition("/")
        if isinstance(got, str) and got.partition("/")[0] == name:
            raise RecordError(
                f"{where}: schema: unsupported version {got!r} (this reader knows {schema!r})"
            )
        raise RecordError(f"{where}: schema: expected {schema!r}, got {got!r}")
    return row


def read_records(
    path: str | Path, schema: str, check: Callable[[dict[str, Any], str], None] | None = None
) -> list[dict[str, Any]]:
    """All records of a JSONL file as a list (see iter_records)."""
    return list(iter_records(path, schema, check))


def dumps(record: dict[str, Any]) -> str:
    """One compact JSON line (no trailing newline)."""
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


def write_records(path: str | Path, records: Iterable[dict[str, Any]]) -> int:
    """Write records as JSONL to ``path`` (``-`` = stdout); return how many were written."""
    n = 0
    if str(path) == "-":
        for rec in records:
            sys.stdout.write(dumps(rec) + "\n")
            n += 1
        sys.stdout.flush()
        return n
    with Path(path).open("w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(dumps(rec) + "\n")
            n += 1
    return n
