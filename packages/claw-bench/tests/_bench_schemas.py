"""Validate records against the repository's JSON Schemas (formats/), when the checkout has them."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

FORMATS = Path(__file__).resolve().parents[3] / "formats"


def validate(record: dict, name: str) -> None:
    """Raise when ``record`` breaks formats/claw.<name>.v1.schema.json; skip outside the repository."""
    path = FORMATS / f"claw.{name}.v1.schema.json"
    if not path.is_file():
        pytest.skip("formats/ is not next to this package (installed alone)")
    jsonschema.Draft202012Validator(json.loads(path.read_text())).validate(record)
