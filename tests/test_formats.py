"""The records contract: every golden example validates against its schema; bad rows are named."""

import json
from pathlib import Path

import jsonschema
import pytest

FORMATS = Path(__file__).resolve().parents[1] / "formats"
RECORDS = ["job", "run", "call", "outcome", "sample", "policy"]


def _schema(name: str) -> dict:
    return json.loads((FORMATS / f"claw.{name}.v1.schema.json").read_text())


def validate_jsonl(path: Path, schema: dict) -> list[str]:
    """Return one message per invalid line: file, line number, field path and what was wrong."""
    validator = jsonschema.Draft202012Validator(schema)
    problems = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"{path.name}:{lineno}: not JSON: {exc.msg}")
            continue
        for err in validator.iter_errors(row):
            field = "/".join(str(p) for p in err.absolute_path) or "<record>"
            problems.append(f"{path.name}:{lineno}: {field}: {err.message}")
    return problems


@pytest.mark.parametrize("name", RECORDS)
def test_schema_is_valid_json_schema(name):
    """Each schema is itself a valid draft 2020-12 schema and pins its version string."""
    schema = _schema(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["properties"]["schema"] == {"const": f"claw.{name}/v1"}


@pytest.mark.parametrize("name", RECORDS)
def test_golden_example_validates(name):
    """Every line of the golden example file validates against its schema."""
    path = FORMATS / f"claw.{name}.v1.example.jsonl"
    assert path.read_text().strip(), f"{path} is empty"
    assert validate_jsonl(path, _schema(name)) == []


def test_call_logprobs_align_in_golden_example():
    """The golden calls keep completion_logprobs as long as completion_ids."""
    for line in (FORMATS / "claw.call.v1.example.jsonl").read_text().splitlines():
        row = json.loads(line)
        assert len(row["completion_logprobs"]) == len(row["completion_ids"])


@pytest.mark.parametrize(
    ("name", "mutate", "expected"),
    [
        ("call", lambda r: r.pop("session"), "'session' is a required property"),
        ("call", lambda r: r.update(api="gemini"), "api: 'gemini' is not one of"),
        ("call", lambda r: r.update(schema="claw.call/v2"), "schema: 'claw.call/v1' was expected"),
        ("outcome", lambda r: r.update(status="crashed"), "status: 'crashed' is not one of"),
        ("job", lambda r: r["workspace"]["files"].update({"../escape": "x"}), "workspace/files"),
        ("sample", lambda r: r.update(parent=[-2]), "parent/0"),
    ],
)
def test_malformed_example_is_rejected_with_a_clear_message(tmp_path, name, mutate, expected):
    """A broken copy of a golden row is rejected; the message names file, line and field."""
    rows = [
        json.loads(x) for x in (FORMATS / f"claw.{name}.v1.example.jsonl").read_text().splitlines()
    ]
    mutate(rows[0])
    bad = tmp_path / f"bad.{name}.jsonl"
    bad.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    problems = validate_jsonl(bad, _schema(name))
    assert problems, "the malformed row was accepted"
    assert problems[0].startswith(f"bad.{name}.jsonl:1: ")
    assert expected in problems[0], problems


def test_non_json_line_is_named(tmp_path):
    """A line that is not JSON is reported with its line number."""
    bad = tmp_path / "bad.jsonl"
    good = (FORMATS / "claw.policy.v1.example.jsonl").read_text()
    bad.write_text(good + "{not json\n")
    assert validate_jsonl(bad, _schema("policy")) == [
        "bad.jsonl:2: not JSON: Expecting property name enclosed in double quotes"
    ]
