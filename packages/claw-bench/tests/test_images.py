"""Task images: listing them, building the missing ones with the docker CLI, and clear errors.

The unit tests put a fake `docker` first on PATH (it records its argv and answers version,
image inspect and build from a state folder); the last test builds a Harbor task's image with
the real engine, from a busybox base image it imports itself (no registry needed).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest
from claw_bench import DockerError, build_images, list_images, load_suite
from claw_bench.cli import main
from click.testing import CliRunner

HERE = Path(__file__).parent
TB = HERE / "fixtures" / "public" / "harbor" / "tb-fix-config"
HELLO = HERE / "data" / "harbor" / "hello-harbor"

FAKE_DOCKER = r"""#!{python}
import json, os, sys
state = os.environ["FAKE_DOCKER_STATE"]
args = sys.argv[1:]
with open(os.path.join(state, "argv.jsonl"), "a") as f:
    f.write(json.dumps(args) + "\n")
present = os.path.join(state, "present")
have = set(open(present).read().split()) if os.path.exists(present) else set()
if args[0] == "version":
    if os.path.exists(os.path.join(state, "no-engine")):
        sys.exit("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?")
    print("99.0")
elif args[:2] == ["image", "inspect"]:
    if args[-1] not in have:
        sys.exit(f"Error: No such image: {args[-1]}")
    print("sha256:0123")
elif args[0] == "build":
    tag, context = args[2], args[3]
    print(f"Step 1/1 : building {tag} from {context}")
    slow = os.path.join(state, "slow")
    if os.path.exists(slow) and tag in open(slow).read().split():
        print("slow step", flush=True)
        import time
        time.sleep(60)
    fail = os.path.join(state, "fail")
    if os.path.exists(fail) and tag in open(fail).read().split():
        for i in range(30):
            print(f"log line {i}")
        sys.exit("ERROR: boom")
    with open(present, "a") as f:
        f.write(tag + "\n")
else:
    sys.exit(f"fake docker: unexpected {args}")
"""


class FakeDocker:
    """The state of the fake `docker` on PATH: images present, tags whose build fails, argv calls."""

    def __init__(self, root: Path):
        self.state = root / "state"
        self.state.mkdir()
        bin_dir = root / "bin"
        bin_dir.mkdir()
        exe = bin_dir / "docker"
        exe.write_text(FAKE_DOCKER.replace("{python}", sys.executable))
        exe.chmod(0o755)
        self.bin = bin_dir

    def have(self, *images: str) -> None:
        with (self.state / "present").open("a") as f:
            f.writelines(f"{i}\n" for i in images)

    def fail(self, *images: str) -> None:
        (self.state / "fail").write_text("".join(f"{i}\n" for i in images))

    def calls(self, verb: str | None = None) -> list[list[str]]:
        p = self.state / "argv.jsonl"
        rows = [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []
        return [r for r in rows if verb is None or r[0] == verb]


@pytest.fixture
def docker(tmp_path, monkeypatch) -> FakeDocker:
    fake = FakeDocker(tmp_path)
    monkeypatch.setenv("FAKE_DOCKER_STATE", str(fake.state))
    monkeypatch.setenv("PATH", f"{fake.bin}{os.pathsep}{os.environ.get('PATH', '')}")
    return fake


@pytest.fixture
def suite_dir(tmp_path) -> Path:
    """Two Dockerfile tasks (derived tags), one with docker_image, one claw task (default image)."""
    d = tmp_path / "suite"
    shutil.copytree(TB, d / "tb-fix-config")
    shutil.copytree(TB, d / "tb-other")
    (d / "tb-other" / "environment" / "Dockerfile").write_text(
        "FROM ubuntu:24.04\nWORKDIR /other\n"
    )
    shutil.copytree(HELLO, d / "hello-harbor")
    shutil.copytree(load_suite("claw-toy").get("toy-yes").path, d / "toy-yes")
    return d


def _images(suite_dir: Path) -> dict[str, str]:
    return {t.id: t.image for t in load_suite(suite_dir).tasks}


def _run(*args: str):
    return CliRunner().invoke(main, ["images", "--suite", *args])


def test_listing_reports_each_task_image_and_builds_nothing(docker, suite_dir):
    """Each task's image and whether it is here; tasks without one say default image; no build runs."""
    img = _images(suite_dir)
    docker.have(img["tb-fix-config"], "ubuntu:24.04")
    rows = {r.task: r for r in list_images(load_suite(suite_dir).tasks)}
    assert {k: (r.status, r.image) for k, r in rows.items()} == {
        "hello-harbor": ("present", "ubuntu:24.04"),
        "tb-fix-config": ("present", img["tb-fix-config"]),
        "tb-other": ("missing", img["tb-other"]),
        "toy-yes": ("default", None),
    }
    assert rows["tb-other"].context == str(suite_dir / "tb-other" / "environment")
    assert rows["hello-harbor"].context is None  # named by docker_image: never built here
    r = _run(str(suite_dir))
    assert r.exit_code == 0, r.output
    lines = {x.split()[0]: x.split()[1:] for x in r.stdout.splitlines()}
    assert lines["tb-other"] == ["missing", img["tb-other"]] and lines["toy-yes"] == [
        "default",
        "default",
        "image",
    ]
    assert "4 tasks: 2 present, 1 missing, 1 default image" in r.stderr
    r = _run(str(suite_dir), "--task", "tb-other", "--json")
    assert [json.loads(x)["status"] for x in r.stdout.splitlines()] == ["missing"]
    assert (
        docker.calls("build") == []
        and ["image", "inspect", "--format", "{{.Id}}", img["tb-other"]] in docker.calls()
    )


def test_build_builds_only_the_missing_images(docker, suite_dir):
    """--build runs `docker build -t TAG environment/` for the missing Dockerfile images only, with progress."""
    img = _images(suite_dir)
    docker.have(img["tb-fix-config"], "ubuntu:24.04")
    r = _run(str(suite_dir), "--build")
    assert r.exit_code == 0, r.output
    assert docker.calls("build") == [
        ["build", "-t", img["tb-other"], str(suite_dir / "tb-other" / "environment")]
    ]
    assert (
        f"[1/1] building {img['tb-other']} for tb-other" in r.stderr
        and f"[1/1] built {img['tb-other']}" in r.stderr
    )
    assert "4 tasks: 2 present, 1 built, 1 default image" in r.stderr
    assert {x.split()[0]: x.split()[1] for x in r.stdout.splitlines()}["tb-other"] == "built"
    rows = {
        r.task: r for r in build_images(load_suite(suite_dir).tasks)
    }  # now all here: nothing to build
    assert rows["tb-other"].status == "present" and len(docker.calls("build")) == 1


def test_failed_build_is_reported_with_its_output_and_the_others_still_build(docker, suite_dir):
    """A failing build is `failed` with its last lines; the next image still builds; exit code 1."""
    img = _images(suite_dir)
    docker.have("ubuntu:24.04")
    docker.fail(img["tb-fix-config"])
    lines: list[str] = []
    rows = {r.task: r for r in build_images(load_suite(suite_dir).tasks, progress=lines.append)}
    assert rows["tb-fix-config"].status == "failed" and rows["tb-other"].status == "built"
    out = rows["tb-fix-config"].output.splitlines()
    assert len(out) == 20 and out[-1] == "ERROR: boom" and out[0] == "log line 11"
    assert lines[1].startswith(f"[1/2] FAILED {img['tb-fix-config']}") and lines[3].startswith(
        "[2/2] built"
    )
    r = _run(str(suite_dir), "--build")
    assert r.exit_code == 1
    assert "tb-fix-config: docker build -t" in r.stderr and "log line 29\nERROR: boom" in r.stderr
    assert (
        "4 tasks: 2 present, 1 failed, 1 default image" in r.stderr
    )  # tb-other was built by the first call


def test_build_is_killed_at_the_tasks_build_timeout(docker, suite_dir):
    """[environment] build_timeout_sec kills a build that runs longer; the row says why."""
    toml = suite_dir / "tb-fix-config" / "task.toml"
    toml.write_text(
        toml.read_text().replace("[environment]", "[environment]\nbuild_timeout_sec = 2")
    )
    task = load_suite(suite_dir).get("tb-fix-config")
    assert task.meta["build_timeout_s"] == 2
    (docker.state / "slow").write_text(f"{task.image}\n")
    (row,) = build_images([task])
    assert row.status == "failed" and "killed at the task's build_timeout_sec (2s)" in row.output
    assert "slow step" in row.output


def test_build_timeout_scales_with_the_timeout_multiplier(docker, suite_dir):
    """--timeout-multiplier multiplies build_timeout_sec as it does the jobs' timeouts: a 1 s
    build timeout x 3 kills the build at 3 s, and the row says so."""
    toml = suite_dir / "tb-fix-config" / "task.toml"
    toml.write_text(
        toml.read_text().replace("[environment]", "[environment]\nbuild_timeout_sec = 1")
    )
    task = load_suite(suite_dir).get("tb-fix-config")
    (docker.state / "slow").write_text(f"{task.image}\n")
    (row,) = build_images([task], timeout_multiplier=3)
    assert row.status == "failed" and row.seconds is not None and 3 <= row.seconds < 30
    assert "killed at the task's build_timeout_sec x 3 (3s)" in row.output
    r = _run(str(suite_dir), "--task", "tb-fix-config", "--build", "--timeout-multiplier", "0")
    assert r.exit_code == 2 and "--timeout-multiplier" in r.output


FAKE_SANDBOX = r"""#!{python}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_SANDBOX_ARGV"], "a") as f:
    f.write(json.dumps(args) + "\n")
out, tag = args[args.index("-o") + 1], args[args.index("-t") + 1]
if "FAIL" in open(os.path.join(args[1], "Dockerfile")).read():
    sys.exit("Error: Dockerfile:1: FAIL")
os.makedirs(out)
open(os.path.join(out, "oci-layout"), "w").write('{"imageLayoutVersion": "1.0.0"}')
index = {"manifests": [{"annotations": {"org.opencontainers.image.ref.name": tag}}]}
open(os.path.join(out, "index.json"), "w").write(json.dumps(index))
print("sha256:" + "0" * 64)
"""


def test_claw_sandbox_builder_writes_layouts_and_their_oci_args(
    docker, suite_dir, tmp_path, monkeypatch
):
    """--builder claw-sandbox builds each missing image with `claw-sandbox build CONTEXT -o TMP -t
    TAG --from=NAME=PATH` (no docker call), renames it to its tag's folder, lists every layout
    as `--oci=TAG=PATH` in LAYOUTS/oci-args, sweeps a dead builder's `.build-*` folder, and a
    later listing finds the layouts present."""
    exe = docker.bin / "claw-sandbox"
    exe.write_text(FAKE_SANDBOX.replace("{python}", sys.executable))
    exe.chmod(0o755)
    monkeypatch.setenv("FAKE_SANDBOX_ARGV", str(tmp_path / "sandbox-argv.jsonl"))
    (suite_dir / "tb-other" / "environment" / "Dockerfile").write_text(
        "FROM ubuntu:24.04\n# FAIL\n"
    )
    layouts = tmp_path / "layouts"
    stale = layouts / ".build-claw-harbor_x_0-999999999"  # no such pid
    stale.mkdir(parents=True)
    img = _images(suite_dir)
    r = _run(str(suite_dir), "--build", "--builder", "claw-sandbox", "--layouts", str(layouts),
             "--from", "ubuntu:24.04=ubuntu.tar")  # fmt: skip
    assert r.exit_code == 1, r.output  # tb-other's build failed; the others are built
    assert docker.calls() == [] and not stale.exists()
    argv = [json.loads(x) for x in (tmp_path / "sandbox-argv.jsonl").read_text().splitlines()]
    ctx = str(suite_dir / "tb-fix-config" / "environment")
    assert argv[0][:3] == ["build", ctx, "-o"] and argv[0][4:] == [
        "-t", img["tb-fix-config"], f"--from=ubuntu:24.04={os.path.abspath('ubuntu.tar')}",
    ]  # fmt: skip
    where = layouts / img["tb-fix-config"].replace("/", "_").replace(":", "_")
    rows = {x.split()[0]: x.split()[1:] for x in r.stdout.splitlines()}
    assert rows["tb-fix-config"] == ["built", img["tb-fix-config"], str(where)]
    assert rows["tb-other"][0] == "failed" and "claw-sandbox build" in r.stderr
    assert "Error: Dockerfile:1: FAIL" in r.stderr and f"$(cat {layouts}/oci-args)" in r.stderr
    oci_args = (layouts / "oci-args").read_text().splitlines()
    assert oci_args == [f"--oci={img['tb-fix-config']}={where.absolute()}"]
    assert sorted(p.name for p in layouts.iterdir()) == sorted([where.name, "oci-args"])
    rows2 = {x.task: x for x in list_images(load_suite(suite_dir).tasks, layouts=layouts)}
    assert rows2["tb-fix-config"].status == "present" and rows2["tb-other"].status == "missing"
    assert rows2["tb-fix-config"].layout == str(where)


def test_docker_image_tasks_are_not_built_but_named_to_pull(docker, suite_dir):
    """A missing docker_image stays missing under --build (never built under its name) and exits 1."""
    img = _images(suite_dir)
    docker.have(img["tb-fix-config"], img["tb-other"])
    r = _run(str(suite_dir), "--build")
    assert r.exit_code == 1 and docker.calls("build") == []
    assert "not built here (named by docker_image): docker pull ubuntu:24.04" in r.stderr


def test_docker_missing_or_engine_down_is_one_clear_error(docker, suite_dir, tmp_path, monkeypatch):
    """No docker CLI, or no engine answering, with --builder docker: a DockerError / one CLI
    message, not a traceback. With the default (auto) the listing turns to claw-sandbox's
    layouts instead, and says why."""
    (docker.state / "no-engine").touch()
    r = _run(str(suite_dir), "--builder", "docker")
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit)
    assert "no Docker engine answering docker: Cannot connect to the Docker daemon" in r.stderr
    assert "Traceback" not in r.output
    monkeypatch.setenv("CLAW_BENCH_CACHE", str(tmp_path / "cache"))
    r = _run(str(suite_dir))
    assert r.exit_code == 0, r.output
    assert (
        "Cannot connect to the Docker daemon" in r.stderr and "claw-sandbox (no daemon)" in r.stderr
    )
    rows = {x.split()[0]: x.split()[1] for x in r.stdout.splitlines()}
    assert rows["tb-fix-config"] == "missing" and rows["toy-yes"] == "default"
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(DockerError, match="docker: command not found on PATH"):
        build_images(load_suite(suite_dir).tasks)
    r = _run(str(suite_dir), "--build", "--builder", "docker")
    assert (
        r.exit_code == 1
        and "Error: docker: command not found on PATH" in r.stderr
        and "Traceback" not in r.output
    )
    r = _run("claw-toy")  # every task on the default image: Docker is not needed
    assert r.exit_code == 0 and all(x.split()[1] == "default" for x in r.stdout.splitlines())


# --- the real engine -------------------------------------------------------------------------------

APPLETS = ("sh", "echo", "cat", "ls", "mkdir", "rm", "true")


def _static_busybox() -> str | None:
    path = shutil.which("busybox")
    if not path or not shutil.which("ldd"):
        return None
    ldd = subprocess.run(["ldd", path], capture_output=True, text=True)
    return (
        path
        if ldd.returncode != 0 or "not a dynamic executable" in ldd.stdout + ldd.stderr
        else None
    )


def _rootfs(busybox: str) -> bytes:
    """A tar of a root filesystem: static busybox, its applet links, /tmp."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(busybox, "bin/busybox")
        for name in APPLETS:
            info = tarfile.TarInfo(f"bin/{name}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)
        info = tarfile.TarInfo("tmp")
        info.type, info.mode = tarfile.DIRTYPE, 0o1777
        tar.addfile(info)
    return buf.getvalue()


@pytest.fixture
def base_image():
    """A busybox base image imported from a tar (the engine may have no registry access)."""
    if shutil.which("docker") is None:
        pytest.skip("no docker CLI on PATH")
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        pytest.skip(
            f"no Docker engine answering `docker info`: {(info.stderr.strip().splitlines() or ['?'])[-1]}"
        )
    busybox = _static_busybox()
    if busybox is None:
        pytest.skip(
            "no static busybox to make the base image from (apt-get install busybox-static)"
        )
    tag = f"claw-bench-test-base:{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["docker", "import", "-", tag], input=_rootfs(busybox), capture_output=True, check=True
    )
    yield tag
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


def test_real_engine_builds_a_harbor_task_image(base_image, tmp_path):
    """A Harbor task's Dockerfile builds with the real engine; a command runs in the image."""
    task = tmp_path / "suite" / "busybox-hello"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "instruction.md").write_text("Write hello to hello.txt.\n")
    (task / "tests" / "test.sh").write_text(
        "grep -q hello hello.txt && echo 1 > /logs/verifier/reward.txt\n"
    )
    (task / "environment" / "greeting.txt").write_text("from the build context\n")
    (task / "environment" / "Dockerfile").write_text(
        f"FROM {base_image}\nCOPY greeting.txt /greeting.txt\nRUN echo built > /built.txt\nWORKDIR /app\n"
    )
    tasks = load_suite(tmp_path / "suite").tasks
    image = tasks[0].image
    assert image.startswith("claw-harbor/busybox-hello:")
    try:
        [row] = build_images(tasks)
        assert row.status == "built", row.output
        assert [r.status for r in list_images(tasks)] == ["present"]
        run = subprocess.run(
            ["docker", "run", "--rm", image, "sh", "-c", "echo ok; cat /greeting.txt /built.txt"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        assert run.stdout.splitlines() == ["ok", "from the build context", "built"]
    finally:
        subprocess.run(["docker", "rmi", "-f", image], capture_output=True)
    assert (
        subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode != 0
    )
