"""The shared conformance cases (formats/conformance) are what generate.py makes, and agree with
the JSON Schemas wherever a schema can judge a case."""

import importlib.util
import json
from pathlib import Path

import jsonschema
import pytest

CONFORMANCE = Path(__file__).resolve().parents[1] / "formats" / "conformance"
RECORDS = ["job", "run", "call", "outcome", "sample", "policy"]


def _generator():
    spec = importlib.util.spec_from_file_location(
        "conformance_generate", CONFORMANCE / "generate.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_case_files_are_generated():
    """Every case file is exactly what generate.py writes (edit the script, not the data)."""
    gen = _generator()
    for name, make in gen.FILES.items():
        want = "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in make())
        assert (CONFORMANCE / name).read_text(encoding="utf-8") == want, (
            f"{name}: rerun generate.py"
        )


def _record_cases():
    """The cases a schema can judge: JSON objects without NaN and without unknown fields (the
    schemas describe writers: additionalProperties false); blank lines and NaN are for readers."""
    for name in RECORDS:
        for line in (
            (CONFORMANCE / f"claw.{name}.v1.jsonl").read_text(encoding="utf-8").splitlines()
        ):
            case = json.loads(line)
            text = case["line"]
            if (
                case["verdict"] == "skip"
                or "NaN" in text
                or "Infinity" in text
                or "x_future" in text
            ):
                continue
            try:
                json.loads(text)
            except json.JSONDecodeError:
                continue
            yield name, case


# rejects a JSON Schema cannot express (lengths, trees, cross-field rules, path rules); every
# reader enforces them, and the readers' own conformance tests hold them to it
BEYOND_SCHEMA = {
    "policy": {
        "transfer.buckets.0.bytes not the tensors' aligned size",
        "transfer.buckets.0.dtypes fewer than names",
    },
    "job": {
        "network.proxy_url not http",
        "verify.reward_file absolute",
        "collect absolute",
        "verify.reward_file outside the workspace",
        "workdir a system directory",
    },
    "call": {
        "completion_logprobs shorter than completion_ids",
        "routing.shape with T not P + C - 1 - start",
        "routing.start past prefix.reused_tokens",
        "completion_kept shorter than completion_ids",
    },
    "outcome": {
        "reward null although status is ok",
        "passed null although status is ok",
        "reward set although status is infra_error",
        "passed set although status is infra_error",
    },
    "sample": {
        "position_ids not the depth",
        "parent not before the child",
        "trainable on a root token",
        "logprobs shorter than input_ids",
        "returns of the wrong length",
        "temperatures of the wrong length",
        "routing.shape not matching N",
        "kept of the wrong length",
    },
}


@pytest.mark.parametrize(
    ("name", "case"), list(_record_cases()), ids=lambda x: x if isinstance(x, str) else x["case"]
)
def test_cases_agree_with_the_schema(name, case):
    """A case the schema can judge gets the same verdict from it as from the readers."""
    row = json.loads(case["line"])
    schema = json.loads((CONFORMANCE.parent / f"claw.{name}.v1.schema.json").read_text())
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(row))
    if case["case"] in BEYOND_SCHEMA.get(name, ()):
        assert not errors, "the schema now judges this case: drop it from BEYOND_SCHEMA"
    else:
        assert (not errors) == (case["verdict"] == "accept"), [e.message for e in errors]
