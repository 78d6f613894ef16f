"""A Harbor task that needs its own image passes its oracle on bwrap from that image, built from
its Dockerfile by `claw-sandbox build` (no Docker daemon), and fails on the host's root.

The image: ``FROM scratch``, a root of this host's bash and a few tools (``COPY rootfs/ /``), a
tool at /opt/tool/bin/mytool that exists nowhere on the host, ``ENV PATH`` naming it, a ``RUN``
that writes its config under /etc inside the image being built, a user ``tool`` (``USER``) and
``WORKDIR /app``. The task's solve.sh calls ``mytool``; its test.sh checks the answer, that it
runs as ``tool`` and that /etc/mytool.conf exists."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from _fixture_image import rootfs_dir

pytestmark = [
    pytest.mark.other_clis,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) not installed"),
    pytest.mark.skipif(shutil.which("claw-sandbox") is None, reason="claw-sandbox CLI not on PATH"),
    pytest.mark.skipif(shutil.which("ldd") is None, reason="ldd is needed to gather libraries"),
]
# the image's tools: the task scripts' and those of claw-sandbox's Harbor verify wrapper
TOOLS = (
    "bash",
    "sh",
    "cat",
    "mkdir",
    "id",
    "grep",
    "rm",
    "sed",
    "timeout",
    "tr",
    "awk",
    "head",
    "cp",
)
DOCKERFILE = """\
FROM scratch
COPY rootfs/ /
COPY passwd /etc/passwd
COPY --chmod=755 mytool /opt/tool/bin/mytool
ENV PATH=/opt/tool/bin:/usr/bin:/bin
RUN mkdir -p /etc/mytool && echo "answer=42" > /etc/mytool/mytool.conf
USER tool
WORKDIR /app
"""
TEST_SH = """\
#!/bin/bash
mkdir -p /logs/verifier
if [ "$(cat /app/answer.txt 2>/dev/null)" = "answer=42" ] && [ "$(id -un)" = tool ] \\
   && [ -f /etc/mytool/mytool.conf ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""


def _task(top: Path) -> Path:
    task = top / "tasks" / "needs-its-image"
    env = task / "environment"
    rootfs_dir(env / "rootfs", TOOLS)
    (env / "passwd").write_text("root:x:0:0::/root:/bin/bash\ntool:x:1234:1234::/app:/bin/bash\n")
    (env / "mytool").write_text('#!/bin/bash\ngrep "^answer=" /etc/mytool/mytool.conf\n')
    (env / "Dockerfile").write_text(DOCKERFILE)
    (task / "instruction.md").write_text("Write what `mytool` prints to /app/answer.txt.\n")
    (task / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 60\n')
    (task / "solution").mkdir()
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\nmytool > /app/answer.txt\n")
    (task / "tests").mkdir()
    (task / "tests" / "test.sh").write_text(TEST_SH)
    return task


def _exe(name: str) -> str:
    path = shutil.which(name)
    assert path is not None, f"{name} is not on PATH"
    return os.path.abspath(path)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [_exe(args[0]), *args[1:]], cwd=cwd, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"{args}: {proc.stderr[-3000:]}"
    return proc


def test_task_passes_its_oracle_only_in_its_image_built_without_a_daemon():
    """`claw-sandbox build` makes the OCI layout from environment/Dockerfile (a RUN step runs in
    bwrap over the image being built); the oracle job runs in it with `claw-sandbox run --oci`
    (reward 1.0) and on the host's root without it (reward 0: mytool is not there)."""
    # not under pytest's tmp_path (mode 0700): bwrap may run as the sandbox's unprivileged uid
    top = Path(tempfile.mkdtemp(prefix="claw-bench-test-image-build-"))
    try:
        os.chmod(top, 0o755)
        task = _task(top)
        env = dict(os.environ, DOCKER_HOST="unix:///nonexistent/docker.sock",
                   CLAW_SANDBOX_IMAGE_CACHE=str(top / "cache"))  # fmt: skip
        build = subprocess.run(
            ["claw-sandbox", "build", str(task / "environment"), "-o", str(top / "img")],
            capture_output=True, text=True, env=env, timeout=600,
        )  # fmt: skip
        assert build.returncode == 0, build.stderr
        assert build.stdout.startswith("sha256:") and "step 6/8: RUN" in build.stderr
        _cli("claw-bench", "plan", "--suite", str(top / "tasks"), "--harness", "oracle",
             "-o", "jobs.jsonl", cwd=top)  # fmt: skip
        rewards, logs = {}, {}
        for name, extra in (("image", ["--oci", str(top / "img")]), ("host", [])):
            subprocess.run(
                [_exe("claw-sandbox"), "run", "jobs.jsonl", "--backend", "bwrap", "-o", f"{name}.jsonl",
                 *extra], cwd=top, env=env, check=True, capture_output=True, timeout=600,
            )  # fmt: skip
            _cli("claw-bench", "score", f"{name}.jsonl", "-o", f"{name}-outcomes.jsonl", cwd=top)
            (outcome,) = map(json.loads, (top / f"{name}-outcomes.jsonl").read_text().splitlines())
            (run,) = map(json.loads, (top / f"{name}.jsonl").read_text().splitlines())
            rewards[name] = (outcome["status"], outcome["reward"], run["verify"]["reward"])
            errors = outcome.get("error")
            logs[name] = (run["stderr_tail"], run["verify"]["output"])
        # on the host's root solve.sh exits 127 (mytool: command not found): a failed rollout
        # the verifier scores 0, not an infra error (the exit code is the agent's)
        assert rewards == {"image": ("ok", 1.0, 1.0), "host": ("ok", 0.0, 0.0)}, logs
        assert errors is None and "mytool: command not found" in logs["host"][0]
    finally:
        shutil.rmtree(top)


TINY_DOCKERFILE = """\
FROM scratch
COPY rootfs/ /
COPY answer.conf /etc/answer.conf
WORKDIR /app
"""
TINY_TEST_SH = """\
#!/bin/bash
mkdir -p /logs/verifier
if [ "$(cat /app/answer.txt 2>/dev/null)" = "answer=42" ]; then r=1; else r=0; fi
echo $r > /logs/verifier/reward.txt
"""


def test_images_build_with_claw_sandbox_then_the_dataset_runs_from_its_layouts():
    """`claw-bench images --build --builder claw-sandbox` builds a FROM scratch + COPY task into
    an OCI layout under --layouts (no daemon), lists it as `--oci=TAG=PATH` in LAYOUTS/oci-args,
    and `claw-sandbox run --backend bwrap $(cat LAYOUTS/oci-args)` runs the oracle job in it
    (the job's `image` is the tag): reward 1.0, from /etc/answer.conf that only the image has."""
    top = Path(tempfile.mkdtemp(prefix="claw-bench-test-images-build-"))
    try:
        os.chmod(top, 0o755)
        task = top / "tasks" / "tiny-image"
        env_dir = task / "environment"
        rootfs_dir(env_dir / "rootfs", TOOLS)
        (env_dir / "answer.conf").write_text("answer=42\n")
        (env_dir / "Dockerfile").write_text(TINY_DOCKERFILE)
        (task / "instruction.md").write_text("Copy /etc/answer.conf to /app/answer.txt.\n")
        (task / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 60\n')
        (task / "solution").mkdir()
        (task / "solution" / "solve.sh").write_text(
            "#!/bin/bash\ncat /etc/answer.conf > answer.txt\n"
        )
        (task / "tests").mkdir()
        (task / "tests" / "test.sh").write_text(TINY_TEST_SH)
        env = dict(os.environ, DOCKER_HOST="unix:///nonexistent/docker.sock",
                   CLAW_SANDBOX_IMAGE_CACHE=str(top / "cache"))  # fmt: skip
        # by absolute path: a relative PATH entry does not resolve from cwd=top
        images = [_exe("claw-bench"), "images", "-s", "tasks", "--builder", "claw-sandbox",
                  "--layouts", "layouts"]  # fmt: skip
        built = subprocess.run([*images, "--build"], cwd=top, env=env, capture_output=True,
                               text=True, timeout=600)  # fmt: skip
        assert built.returncode == 0, built.stderr
        (tag,) = [line.split()[2] for line in built.stdout.splitlines()]
        assert built.stdout.split()[1] == "built" and tag.startswith("claw-harbor/tiny-image:")
        oci_args = (top / "layouts" / "oci-args").read_text().split()
        assert len(oci_args) == 1 and oci_args[0].startswith(f"--oci={tag}={top}/layouts/")
        again = subprocess.run([*images, "--build", "--json"], cwd=top, env=env,
                               capture_output=True, text=True, timeout=600)  # fmt: skip
        (row,) = map(json.loads, again.stdout.splitlines())
        assert again.returncode == 0 and row["status"] == "present", again.stderr
        _cli("claw-bench", "plan", "--suite", "tasks", "--harness", "oracle", "-o", "jobs.jsonl",
             cwd=top)  # fmt: skip
        (job,) = map(json.loads, (top / "jobs.jsonl").read_text().splitlines())
        assert job["image"] == tag
        run = subprocess.run(
            ["bash", "-c", '"$0" run jobs.jsonl --backend bwrap -o runs.jsonl $(cat layouts/oci-args)',
             _exe("claw-sandbox")], cwd=top, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        _cli("claw-bench", "score", "runs.jsonl", "-o", "outcomes.jsonl", cwd=top)
        (outcome,) = map(json.loads, (top / "outcomes.jsonl").read_text().splitlines())
        assert (outcome["status"], outcome["reward"]) == ("ok", 1.0), run.stderr
    finally:
        shutil.rmtree(top)
