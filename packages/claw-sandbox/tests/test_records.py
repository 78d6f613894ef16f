"""Reading claw.job/v1 lines and writing claw.run/v1 records."""

import base64
import io
import json
import re

import jsonschema
import pytest
from claw_sandbox import Job, JobError, JobsFileError, Run, read_jobs, read_runs
from claw_sandbox.records import BadLine
from sandbox_testlib import FORMATS, job


def _lines(*rows) -> io.StringIO:
    return io.StringIO("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def test_golden_jobs_parse_and_round_trip():
    """Every golden job parses; to_dict validates against the schema and parses back equal."""
    schema = json.loads((FORMATS / "claw.job.v1.schema.json").read_text())
    with (FORMATS / "claw.job.v1.example.jsonl").open() as f:
        jobs = list(read_jobs(f, "example"))
    assert [type(j) for j in jobs] == [Job] * len(jobs)
    first = jobs[0]
    assert first.network.policy == "proxy" and first.network.port == 18080
    assert first.verify.reward_file == ".verify/reward" and first.limits.pids == 256
    for j in jobs:
        jsonschema.validate(j.to_dict(), schema)
        assert Job.from_dict(j.to_dict()) == j


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ("{not json", "jobs.jsonl:2: not JSON"),
        (
            {"schema": "claw.job/v1", "job_id": "x"},
            "jobs.jsonl:2: job 'x': command: missing required field",
        ),
        (
            job("x", workspace={"files": {"../up": "x"}}),
            "workspace/files/../up: path '../up' escapes",
        ),
        (job("x", workspace={"files": {"/etc/passwd": "x"}}), "escapes the workspace"),
        (job("x", verify={"command": "true", "reward_file": "../r"}), "verify/reward_file"),
        (job("x", collect=["../../*"]), "collect/0"),
        (job("x", schema="claw.job/v2"), "schema: unsupported version 'claw.job/v2'"),
        (job("x", network={"policy": "proxy"}), "network/proxy_url: policy proxy needs proxy_url"),
        (job("x", limits={"pids": 0}), "limits/pids: must be positive"),
        (job("x", timeout_s="10"), "timeout_s: expected int or float, got str"),
        (job("x", timeout_s=0), "timeout_s: must be > 0"),
        ({"schema": "claw.job/v1", "command": "true"}, "job_id: missing required field"),
    ],
)
def test_bad_line_is_a_per_job_error_naming_file_line_and_field(row, expected):
    """A bad line becomes a BadLine with file:line and field; the lines around it still parse."""
    items = list(read_jobs(_lines(job("a"), row, job("b")), "some/dir/jobs.jsonl"))
    assert isinstance(items[0], Job) and isinstance(items[2], Job)
    bad = items[1]
    assert isinstance(bad, BadLine)
    assert bad.error.startswith("jobs.jsonl:2: ")
    assert expected in bad.error
    assert bad.job_id in ("x", "jobs.jsonl:2")


def test_duplicate_job_id_is_a_file_error():
    """Two jobs with one id would break resume, so the whole file is refused."""
    with pytest.raises(JobsFileError, match=r"jobs.jsonl:2: job_id 'a' already used on line 1"):
        list(read_jobs(_lines(job("a"), job("a")), "jobs.jsonl"))


def test_proxy_port_defaults_to_the_proxy_urls_port():
    """Without `port`, the proxy appears inside on the same port as on the host."""
    j = Job.from_dict(job(network={"policy": "proxy", "proxy_url": "http://127.0.0.1:8123/v1"}))
    assert j.network.port == 8123


def test_job_error_for_wrong_types_in_nested_fields():
    """Nested type errors name the nested field."""
    with pytest.raises(JobError, match=r"env/K: environment values must be strings"):
        Job.from_dict(job(env={"K": 1}))
    with pytest.raises(JobError, match=r"setup/1: expected a non-empty string"):
        Job.from_dict(job(setup=["true", ""]))


def test_run_record_validates_against_schema():
    """A Run serialises to a schema-valid claw.run/v1 dict and reads back."""
    schema = json.loads((FORMATS / "claw.run.v1.schema.json").read_text())
    run = Run(job_id="j", status="ok", started_at=10.0, ended_at=12.5, exit_code=0, backend="bwrap")
    row = run.to_dict()
    jsonschema.validate(row, schema)
    assert row["duration_s"] == 2.5
    assert Run.from_dict(row) == run
    for line in (FORMATS / "claw.run.v1.example.jsonl").read_text().splitlines():
        jsonschema.validate(Run.from_dict(json.loads(line)).to_dict(), schema)


def test_read_runs_drops_only_a_torn_last_line(tmp_path):
    """A killed writer can leave half a line at the end: it is not counted; the rest is."""
    path = tmp_path / "runs.jsonl"
    good = json.dumps({"schema": "claw.run/v1", "job_id": "a", "status": "ok"}) + "\n"
    path.write_text(good + '{"job_id": "b", "sta')
    rows, size = read_runs(path)
    assert [r["job_id"] for r in rows] == ["a"] and size == len(good)
    path.write_text(good + json.dumps({"job_id": "c"}))  # complete JSON, no newline: rewritten
    rows, size = read_runs(path)
    assert [r["job_id"] for r in rows] == ["a"] and size == len(good)
    path.write_text("garbage\n" + good)
    with pytest.raises(JobsFileError, match=r"runs.jsonl:1: not JSON"):
        read_runs(path)


def test_binary_files_travel_as_base64_and_round_trip():
    """{"content_b64"} entries decode to exact bytes; to_dict writes them back the same way."""
    data = bytes(range(256))
    b64 = base64.b64encode(data).decode()
    row = job(
        "b",
        workspace={"files": {"a.bin": {"content_b64": b64}, "t.txt": "x"}},
        verify={"command": "true", "files": {"tests/d.bin": {"content_b64": b64}}},
    )
    j = Job.from_dict(row)
    assert j.files == {"a.bin": data, "t.txt": "x"} and j.verify.files == {"tests/d.bin": data}
    out = j.to_dict()
    assert out["workspace"]["files"]["a.bin"] == {"content_b64": b64}
    assert out["verify"]["files"]["tests/d.bin"] == {"content_b64": b64}
    jsonschema.validate(out, json.loads((FORMATS / "claw.job.v1.schema.json").read_text()))
    assert Job.from_dict(out) == j


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"content_b64": "!!"}, "a.bin/content_b64: not base64"),
        ({"content_b64": 1}, 'expected a string or {"content_b64"'),
        ({"content": "x"}, 'expected a string or {"content_b64"'),
    ],
)
def test_bad_binary_file_entry_names_the_field(entry, expected):
    """A malformed binary entry is a JobError naming the file's field."""
    with pytest.raises(JobError, match=re.escape(expected)):
        Job.from_dict(job("b", workspace={"files": {"a.bin": entry}}))


def test_verify_network_round_trips_and_bad_values_name_the_field():
    """verify.network {"policy": "host"} parses, validates and writes back; another value is a
    JobError naming verify/network."""
    schema = json.loads((FORMATS / "claw.job.v1.schema.json").read_text())
    row = job("vn", verify={"command": "true", "network": {"policy": "host"}})
    parsed = Job.from_dict(row)
    assert parsed.verify.network == "host"
    jsonschema.validate(parsed.to_dict(), schema)
    assert parsed.to_dict()["verify"]["network"] == {"policy": "host"}
    assert Job.from_dict(job("vp", verify={"command": "true"})).verify.network is None
    with pytest.raises(JobError, match="verify/network"):
        Job.from_dict(job("vb", verify={"command": "true", "network": {"policy": "proxy"}}))


def test_docker_refuses_a_verify_network_other_than_the_jobs():
    """The docker backend runs a job's steps in one container (one network): a verify step that
    asks for another network is a JobError naming verify/network, checked without a daemon."""
    from claw_sandbox.backends.docker import DockerBackend

    backend = DockerBackend(default_image="img")
    backend.check_job(
        Job.from_dict(job("same", verify={"command": "true", "network": {"policy": "none"}}))
    )
    with pytest.raises(JobError, match="verify/network: host differs"):
        backend.check_job(
            Job.from_dict(job("vh", verify={"command": "true", "network": {"policy": "host"}}))
        )
