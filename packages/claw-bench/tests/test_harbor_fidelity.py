"""Harbor tasks run as Harbor runs them: a Dockerfile's ENV PATH="/opt/x/bin:${PATH}" expanded, a
verifier that moves /tests away, compose sidecars never dropped silently (issue 26)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from _bench_schemas import validate
from claw_bench import TaskError, load_harness, load_suite, plan_jobs
from claw_bench._dockerfile import DEFAULT_PATH
from claw_bench.cli import main
from click.testing import CliRunner

FIX = Path(__file__).parent / "fixtures" / "issue26" / "harbor"
TASKS = ("hb-compose", "hb-env-path", "hb-moves-tests")


def test_fixture_suite_loads_with_expanded_env_and_the_compose_reason():
    """The Dockerfile's PATH is the tool directory before Docker's default PATH; the compose task
    loads with the reason it cannot run (its sidecar named)."""
    s = load_suite(FIX)
    assert tuple(t.id for t in s.tasks) == TASKS and s.skipped == ()
    env = s.get("hb-env-path").meta["harbor"]["image_env"]
    assert env == {
        "TOOL_HOME": "/opt/x",
        "PATH": f"/opt/x/bin:{DEFAULT_PATH}",
        "GREETING": "ready, from $TOOL_HOME",
    }
    compose = s.get("hb-compose").meta
    info = compose["compose"]
    assert (info["file"], info["services"], info["sidecars"]) == (
        "environment/docker-compose.yaml",
        ["cache", "main"],
        ["cache"],
    )
    (svc,) = info["job_services"]  # built from environment/cache/ (claw-bench images --build)
    assert svc["name"] == "cache" and svc["image"].startswith("claw-harbor/hb-compose-cache:")
    assert "sidecar services (cache)" in compose["unsupported"]
    assert all("unsupported" not in s.get(t).meta for t in TASKS[1:])


def test_compose_task_is_planned_as_not_scorable_and_strict_refuses_it(tmp_path):
    """plan: every harness's job of the compose task is a no-op whose meta says why (its outcome
    is not_scorable); the warning names it; --strict makes it an error naming the file."""
    task = load_suite(FIX).get("hb-compose")
    jobs = plan_jobs([task], [load_harness("oracle"), load_harness("nothing")], samples=1)
    for j in jobs:
        validate(j, "job")
        assert j["command"] == "true" and "verify" not in j and j["setup"] == []
        assert j["meta"]["not_scorable"].startswith("task hb-compose skipped: ")
        assert "docker-compose.yaml starts sidecar services (cache)" in j["meta"]["not_scorable"]
    out = tmp_path / "jobs.jsonl"
    r = CliRunner().invoke(main, ["plan", "-s", str(FIX), "-H", "oracle", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "warning: task hb-compose will not run (not_scorable)" in r.output
    assert len(out.read_text().splitlines()) == 3
    r = CliRunner().invoke(
        main, ["plan", "-s", str(FIX), "-H", "oracle", "--strict", "-o", str(out)]
    )
    assert r.exit_code != 0 and "hb-compose cannot run" in r.output
    assert "docker-compose.yaml starts sidecar services (cache)" in r.output
    with pytest.raises(TaskError, match="cannot run"):
        load_suite(FIX / "hb-compose", strict=True)


@pytest.mark.parametrize(
    ("name", "text", "want"),
    [
        ("compose.yaml", "services:\n  main:\n    environment: [A=1]\n", "overrides the main"),
        ("docker-compose.yml", "services:\n  db: {image: x}\n", "sidecar services (db)"),
        ("compose.yaml", "services: [a, b]\n", TaskError),
        ("compose.yaml", "services: {a: [\n", TaskError),
    ],
)
def test_every_compose_file_name_is_seen(tmp_path, name, text, want):
    """compose.yaml / docker-compose.yml are found too; a main-only override is also a reason; a
    malformed file is a TaskError naming it."""
    d = tmp_path / "t"
    shutil.copytree(FIX / "hb-env-path", d)
    (d / "environment" / name).write_text(text)
    if want is TaskError:
        with pytest.raises(TaskError, match=name.replace(".", r"\.")):
            load_suite(d)
    else:
        assert want in load_suite(d).tasks[0].meta["unsupported"]


def _sandbox(jobs: Path, runs: Path, backend: str, *extra: str) -> None:
    doctor = subprocess.run(["claw-sandbox", "doctor"], capture_output=True, text=True)
    if not any(line.split()[:2] == ["ok", backend] for line in doctor.stdout.splitlines()):
        pytest.skip(f"{backend} backend unavailable here (claw-sandbox doctor)")
    p = subprocess.run(
        ["claw-sandbox", "run", str(jobs), "-o", str(runs), "--backend", backend, *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr


def _flow(tmp_path: Path, backend: str, *extra: str) -> dict:
    """plan oracle + nothing -> claw-sandbox run -> score: {(task, harness): (status, reward)}."""
    jobs, runs, outs = tmp_path / "jobs.jsonl", tmp_path / "runs.jsonl", tmp_path / "out.jsonl"
    r = CliRunner().invoke(
        main,
        ["plan", "-s", str(FIX), "-H", "oracle", "-H", "nothing", "--network", "none",
         "-o", str(jobs)],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    _sandbox(jobs, runs, backend, *extra)
    r = CliRunner().invoke(main, ["score", str(runs), "-o", str(outs)])
    assert r.exit_code == 0, r.output
    got = {}
    for o in map(json.loads, outs.read_text().splitlines()):
        got[(o["task"], o["harness"])] = (o["status"], o["reward"], o.get("error"))
    return got


def _check_flow(got: dict) -> None:
    for task in ("hb-env-path", "hb-moves-tests"):
        assert got[(task, "oracle")] == ("ok", 1.0, None), (task, got)
        assert got[(task, "nothing")][:2] == ("ok", 0.0), (task, got)
    for h in ("oracle", "nothing"):
        status, reward, error = got[("hb-compose", h)]
        assert (status, reward) == ("not_scorable", None) and "sidecar services (cache)" in error


@pytest.mark.other_clis
@pytest.mark.skipif(shutil.which("claw-sandbox") is None, reason="claw-sandbox CLI not on PATH")
def test_flow_on_bwrap(tmp_path):
    """On bwrap: the ENV PATH task's oracle passes (its PATH was the literal text: every command
    exited 127); the verifier that moves /tests passes (it was a mount point); the compose task
    is not_scorable with its reason."""
    _check_flow(_flow(tmp_path, "bwrap"))


@pytest.mark.slow
@pytest.mark.other_clis
@pytest.mark.skipif(shutil.which("claw-sandbox") is None, reason="claw-sandbox CLI not on PATH")
def test_flow_on_docker(tmp_path):
    """The same on docker, the task images built from environment/ on the locally imported base
    image (the built image's own PATH and the job's agree)."""
    from _fixture_image import BASE_IMAGE, ensure_base_image

    why = ensure_base_image()
    if why:
        pytest.skip(f"no local base image for the fixtures: {why}")
    r = CliRunner().invoke(main, ["images", "--suite", str(FIX), "--build"])
    assert r.exit_code == 0, r.output
    _check_flow(_flow(tmp_path, "docker", "--image", BASE_IMAGE))
