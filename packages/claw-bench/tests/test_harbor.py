"""The Harbor / Terminal-Bench importer: layout, path rewriting, verification, mixed suites, errors."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from claw_bench import TaskError, check_task, load_harbor_task, load_suite
from claw_bench.harbor import context_tag, harbor_reward_file

FIXTURE = Path(__file__).parent / "data" / "harbor" / "hello-harbor"


def test_harbor_task_loads_with_its_settings():
    """instruction.md, task.toml timeouts / image / tags, tests/ and solution/ are read."""
    t = load_harbor_task(FIXTURE)
    assert t.id == "hello-harbor" and t.source == "harbor" and "hello, harbor" in t.instruction
    assert (t.timeout_s, t.verify_timeout_s, t.image, t.difficulty) == (
        120.0,
        30.0,
        "ubuntu:24.04",
        "easy",
    )
    assert t.tags == ("files", "harbor") and t.solution is not None
    assert set(t.hidden) == {"tests/check_hello.sh"} and t.verify.name == "tests/test.sh"
    assert (
        t.verify.text == (FIXTURE / "tests" / "test.sh").read_text()
    )  # run from /tests, unchanged
    assert t.reward_file == harbor_reward_file() == "/logs/verifier/reward.txt"
    assert (
        t.meta["dockerfile"].endswith("environment/Dockerfile")
        and t.meta["harbor"]["workdir"] == "/app"
    )
    assert "docker_context" not in t.meta  # docker_image names the image: nothing to build


def test_dockerfile_image_tag_follows_the_environment_content(tmp_path):
    """Without docker_image the tag hashes environment/: a changed Dockerfile or context file gives a new tag."""
    d = tmp_path / "My_Task"
    shutil.copytree(FIXTURE, d)
    (d / "task.toml").write_text(
        (d / "task.toml").read_text().replace('docker_image = "ubuntu:24.04"\n', "")
    )
    t = load_harbor_task(d)
    assert t.image == context_tag("My_Task", d / "environment") and t.image.startswith(
        "claw-harbor/my-task:"
    )
    assert t.meta["docker_context"] == str(d / "environment")
    assert load_harbor_task(d).image == t.image
    (d / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /srv\n")
    changed = load_harbor_task(d).image
    (d / "environment" / "data.txt").write_text("copied in\n")
    assert len({t.image, changed, load_harbor_task(d).image}) == 3


@pytest.mark.other_clis
def test_harbor_task_verifies_untouched_fails_solution_passes():
    """check (in claw-sandbox): the oracle solution passes with reward 1 read from reward.txt; untouched fails with 0."""
    if (
        shutil.which("claw-sandbox") is None
        and not (Path(sys.executable).parent / "claw-sandbox").exists()
    ):
        pytest.skip("claw-sandbox is not installed: check runs tasks only in the sandbox")
    t = load_harbor_task(FIXTURE)
    assert check_task(t, "untouched")["reward"] == 0.0
    r = check_task(t, "solution")
    assert r["passed"] and r["reward"] == 1.0


def test_mixed_suite_directory(tmp_path):
    """A directory holding claw and Harbor task directories loads as one suite."""
    shutil.copytree(FIXTURE, tmp_path / "hello-harbor")
    shutil.copytree(load_suite("claw-toy").get("toy-yes").path, tmp_path / "toy-yes")
    s = load_suite(tmp_path)
    assert [(t.id, t.source) for t in s.tasks] == [("hello-harbor", "harbor"), ("toy-yes", "claw")]


def test_harbor_errors_name_the_file(tmp_path):
    """A Harbor task without tests/test.sh, or with invalid task.toml, is named."""
    d = tmp_path / "broken"
    shutil.copytree(FIXTURE, d)
    (d / "task.toml").write_text("[agent\n")
    with pytest.raises(TaskError, match=r"broken/task\.toml: invalid TOML"):
        load_harbor_task(d)
    (d / "task.toml").unlink()
    (d / "tests" / "test.sh").unlink()
    with pytest.raises(TaskError, match=r"broken: missing verifier: expected tests/test\.sh"):
        load_harbor_task(d)


def test_dockerfile_gives_workdir_env_local_copies_and_lists_the_rest(tmp_path):
    """WORKDIR (relative ones resolved), ENV (both forms), COPY/ADD of local files or folders into
    the WORKDIR become workspace files; RUN lines and copies elsewhere or from stages are listed."""
    from claw_bench.harbor import read_dockerfile

    env = tmp_path / "environment"
    (env / "src").mkdir(parents=True)
    (env / "src" / "main.py").write_text("print(1)\n")
    (env / "data.bin").write_bytes(b"\xff\x00")
    (env / "cfg.ini").write_text("a = 1\n")
    (env / "Dockerfile").write_text(
        'FROM base\nWORKDIR /srv\nWORKDIR app\nENV A=1 B="two words"\nENV LEGACY value here\n'
        "# a comment\nRUN apt-get update && \\\n    apt-get install -y jq\nCOPY src/ ./src/\n"
        "COPY data.bin cfg.ini ./\nADD cfg.ini /etc/cfg.ini\nCOPY --from=build /out /srv/app/out\n"
        "COPY --chown=1000 cfg.ini conf/app.ini\n"
    )
    workdir, denv, files, skipped = read_dockerfile(env, "task t")
    assert workdir == "/srv/app"
    assert denv == {"A": "1", "B": "two words", "LEGACY": "value here"}
    assert files == {
        "src/main.py": "print(1)\n",
        "data.bin": b"\xff\x00",
        "cfg.ini": "a = 1\n",
        "conf/app.ini": "a = 1\n",
    }
    assert skipped == [
        "RUN apt-get update && apt-get install -y jq",
        "COPY --from=build /out /srv/app/out",
        "ADD cfg.ini /etc/cfg.ini",
    ]
