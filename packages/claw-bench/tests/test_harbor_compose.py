"""Harbor compose sidecars run on docker (issue 29): a compose file's services become the job's
claw.job/v1 ``services`` when planned for the docker backend; elsewhere, or when the file uses
what docker cannot carry out (the key named), the task is a not_scorable job with the reason."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from _bench_schemas import validate
from claw_bench import TaskError, load_harness, load_suite, plan_jobs
from claw_bench._compose import ComposeUnsupported, compose_services, duration_s
from claw_bench.cli import main
from click.testing import CliRunner

FIX = Path(__file__).parent / "fixtures" / "issue29" / "harbor"
OLD = Path(__file__).parent / "fixtures" / "issue26" / "harbor" / "hb-compose"
REL = "environment/compose.yaml"


def _services(text: str) -> list[dict]:
    return compose_services(yaml.safe_load(text), REL)


def test_sidecars_become_services_in_dependency_order():
    """image, environment (list or mapping), command (a string split as compose splits it, no
    shell), healthcheck (CMD / CMD-SHELL, durations) and depends_on order; $$ is a literal $."""
    got = _services(
        """
services:
  main: {depends_on: [api]}
  api:
    image: api:1
    command: serve --port 80 --greeting "hi there"
    depends_on: {db: {condition: service_healthy}}
    environment: [DB=db:5432, COST=$$5]
    expose: ["80"]
  db:
    image: db:2
    environment: {POSTGRES_PASSWORD: x, EMPTY: null}
    healthcheck: {test: [CMD-SHELL, pg_isready], interval: 1m30s, timeout: 500ms, retries: 5,
                  start_period: 30s}
"""
    )
    assert got == [
        {
            "name": "db",
            "image": "db:2",
            "env": {"POSTGRES_PASSWORD": "x", "EMPTY": ""},
            "healthcheck": {
                "command": "pg_isready", "interval_s": 90.0, "timeout_s": 0.5, "retries": 5,
                "start_period_s": 30.0,
            },
        },
        {
            "name": "api",
            "image": "api:1",
            "env": {"DB": "db:5432", "COST": "$5"},
            "command": ["serve", "--port", "80", "--greeting", "hi there"],
        },
    ]  # fmt: skip
    assert duration_s(3, "x") == 3.0 and duration_s("1h2s", "x") == 3602.0


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("services: {db: {image: x, volumes: ['./data:/data']}}", "services.db.volumes"),
        ("services: {db: {image: x, ports: ['5432:5432']}}", "services.db.ports"),
        ("services: {db: {image: x, profiles: [debug]}}", "services.db.profiles"),
        ("services: {db: {build: ./db}}", "services.db.build"),
        ("services: {db: {image: x, build: ./db}}", "services.db.build"),
        ("services: {db: {image: x}}\nnetworks: {back: {}}", "top-level key 'networks'"),
        ("services: {db: {image: x}, main: {environment: [A=1]}}", "services.main.environment"),
        ("services: {db: {image: 'x:${TAG}'}}", "variable interpolation"),
        ("services: {db: {image: x, environment: [API_KEY]}}", "API_KEY without a value"),
        ("services: {db: {image: x, healthcheck: {test: [CMD, x], foo: 1}}}", "healthcheck.foo"),
        ("services: {db: {image: x, healthcheck: {test: [CMD], interval: soon}}}", "test"),
        ("services: {a: {image: x, depends_on: [b]}, b: {image: x, depends_on: [a]}}", "cycle"),
        ("services: {a: {image: x, depends_on: [nope]}}", "'nope'"),
        (
            "services: {a: {image: x, depends_on: {b: {condition: service_completed_successfully}}},"
            " b: {image: x}}",
            "service_completed_successfully",
        ),
        ("services: {DB: {image: x}}", "not a host name"),
    ],
)
def test_what_docker_cannot_carry_out_is_named(text, named):
    """Volumes, ports, profiles, builds, networks, main overrides, interpolation...: an error
    naming the key, never a service with the key dropped."""
    with pytest.raises(ComposeUnsupported, match=named.replace("$", r"\$").replace("[", r"\[")):
        _services(text)


BUILD_ELSEWHERE = "services:\n  cache:\n    build: {context: ./cache, dockerfile: Other}\n"


def _with_compose(tmp_path: Path, text: str):
    """The hb-compose task with another compose file."""
    d = tmp_path / "hb-compose"
    shutil.copytree(OLD, d)
    (d / "environment" / "docker-compose.yaml").write_text(text)
    return load_suite(d).tasks[0]


def test_plan_for_docker_gives_the_job_its_services(tmp_path):
    """With backend docker the oracle job runs the solution with the sidecar as a service (schema
    valid); with another or no backend it is the not_scorable no-op saying docker runs it; a
    sidecar built from a folder gets that folder's image tag; a build with a Dockerfile elsewhere
    is not_scorable on docker too, naming the key."""
    task = load_suite(FIX).get("hb-sidecar")
    oracle = load_harness("oracle")
    (job,) = plan_jobs([task], [oracle], samples=1, backend="docker")
    validate(job, "job")
    assert "not_scorable" not in job["meta"] and job["verify"] is not None
    (svc,) = job["services"]
    assert svc["name"] == "colors" and svc["image"] == "claw-bench-fixture/base:1"
    assert svc["env"] == {"COLOR": "teal"} and svc["healthcheck"]["interval_s"] == 0.5
    for backend in ("bwrap", "process", None):
        (j,) = plan_jobs([task], [oracle], samples=1, backend=backend)
        assert "services" not in j and j["command"] == "true"
        assert "only claw-sandbox's docker backend starts them" in j["meta"]["not_scorable"]
    (j,) = plan_jobs([load_suite(OLD).tasks[0]], [oracle], samples=1, backend="docker")
    assert j["services"][0]["image"].startswith("claw-harbor/hb-compose-cache:")
    task = _with_compose(tmp_path, BUILD_ELSEWHERE)
    (j,) = plan_jobs([task], [oracle], samples=1, backend="docker")
    assert "services" not in j
    assert "services.cache.build.dockerfile is not supported" in j["meta"]["not_scorable"]


def test_strict_and_warnings_follow_the_backend(tmp_path):
    """--strict refuses the compose task unless planned for docker; the warning says why."""
    out = tmp_path / "jobs.jsonl"
    args = ["plan", "-s", str(FIX), "-H", "oracle", "-o", str(out), "--strict"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code != 0 and "hb-sidecar cannot run" in r.output
    r = CliRunner().invoke(main, [*args, "--backend", "docker"])
    assert r.exit_code == 0 and "warning" not in r.output, r.output
    (job,) = map(json.loads, out.read_text().splitlines())
    assert job["services"][0]["name"] == "colors"
    _with_compose(tmp_path, BUILD_ELSEWHERE)
    with pytest.raises(TaskError, match="services.cache.build.dockerfile"):
        load_suite(tmp_path / "hb-compose", strict=True, backend="docker")


def _run_docker(jobs: list[dict], tmp_path: Path) -> dict:
    """The jobs through `claw-sandbox run --backend docker`, scored: {job_id: outcome}."""
    path, runs, outs = tmp_path / "jobs.jsonl", tmp_path / "runs.jsonl", tmp_path / "out.jsonl"
    path.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    p = subprocess.run(
        ["claw-sandbox", "run", str(path), "-o", str(runs), "--backend", "docker"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    r = CliRunner().invoke(main, ["score", str(runs), "-o", str(outs)])
    assert r.exit_code == 0, r.output
    return {o["job_id"]: o for o in map(json.loads, outs.read_text().splitlines())}


@pytest.mark.slow
@pytest.mark.other_clis
@pytest.mark.skipif(shutil.which("claw-sandbox") is None, reason="claw-sandbox CLI not on PATH")
def test_sidecar_task_on_docker(tmp_path):
    """On docker the oracle reads the sidecar's answer and passes; `nothing` scores 0; the same
    oracle job without its service scores 0 (the sidecar is what the verifier checks)."""
    from _fixture_image import ensure_base_image

    doctor = subprocess.run(["claw-sandbox", "doctor"], capture_output=True, text=True)
    if not any(line.split()[:2] == ["ok", "docker"] for line in doctor.stdout.splitlines()):
        pytest.skip("docker backend unavailable here (claw-sandbox doctor)")
    why = ensure_base_image()
    if why:
        pytest.skip(f"no local base image for the fixtures: {why}")
    for suite in (FIX, OLD):  # OLD's sidecar is built from its environment/cache/ folder
        r = CliRunner().invoke(main, ["images", "--suite", str(suite), "--build"])
        assert r.exit_code == 0 and "missing" not in r.output, r.output
    hs = [load_harness("oracle"), load_harness("nothing")]
    tasks = [*load_suite(FIX).tasks, *load_suite(OLD).tasks]
    jobs = plan_jobs(tasks, hs, samples=1, backend="docker", run_id="r")
    alone = {k: v for k, v in jobs[0].items() if k != "services"}
    alone["job_id"] += "-alone"
    got = _run_docker([*jobs, alone], tmp_path)
    oracle, nothing, built_oracle, _ = (got[j["job_id"]] for j in jobs)
    assert (oracle["status"], oracle["reward"]) == ("ok", 1.0), oracle
    assert (nothing["status"], nothing["reward"]) == ("ok", 0.0), nothing
    assert (built_oracle["status"], built_oracle["reward"]) == ("ok", 1.0), built_oracle
    assert got[alone["job_id"]]["reward"] == 0.0, got[alone["job_id"]]
