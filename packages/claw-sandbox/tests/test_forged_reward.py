"""An agent cannot forge its reward: whatever it leaves at the reward path (a read-only file in a
read-only directory, a symlink, a fifo, a directory, a huge file, a process that keeps writing)
is gone before the verifier starts, and a verifier that times out yields no reward at all. Each
case runs on bwrap and docker, in the claw profile (reward in the workspace) and the harbor
profile (reward under the /logs/verifier mount)."""

import pytest
from claw_sandbox import run_jobs
from sandbox_testlib import job
from test_docker import IMAGE, docker_backend  # noqa: F401  (the fixture builds the image)

# (reward file, its directory) in each profile
PLACES = {"claw": (".v/reward", ".v"), "harbor": ("/logs/verifier/reward.txt", "/logs/verifier")}


@pytest.fixture(params=["bwrap", pytest.param("docker", marks=pytest.mark.slow)])
def backend(request):
    """(backend, the prefix of tools missing from the docker test image's busybox links)."""
    if request.param == "docker":
        return request.getfixturevalue("docker_backend"), "busybox "
    return request.getfixturevalue("bwrap"), ""


def _job(backend, profile: str, name: str, plant: str, verify: str, **vfields) -> dict:
    reward, _ = PLACES[profile]
    fields: dict = {
        "verify": {"command": verify, "reward_file": reward, "timeout_s": 60, **vfields}
    }
    if profile == "harbor":
        fields.update(profile="harbor", workdir="/app", mounts=[{"target": "/logs/verifier"}])
    if backend.name == "docker":
        fields["image"] = IMAGE
    return job(f"{profile}-{name}", command=plant, timeout_s=60, **fields)


def _runs(backend, rows) -> dict:
    """Run in the default job root (the harbor profile's dropped uid must reach it on bwrap)."""
    runs = run_jobs(rows, backend=backend, retries=0, parallel=4)
    return {r["job_id"]: r for r in runs}


@pytest.mark.parametrize("profile", ["claw", "harbor"])
def test_planted_reward_is_never_scored(backend, profile):
    """Read-only file and directory, a link to a file holding 1, a linked parent directory, a
    fifo, a directory, a 10 GB sparse file at the reward path: the verifier writes its own reward
    (or none, then its exit code counts), and the planted one is never read."""
    b, bb = backend
    f, d = PLACES[profile]
    plants = {
        # the reported forgery: reward 1, then chmod 444 the file and 555 its directory
        "readonly": (f"mkdir -p {d}; echo 1 > {f}; {bb}chmod 444 {f}; {bb}chmod 555 {d}",
                     f"rm -f {f}; echo 0.25 > {f}", 0.25),
        "symlink": (f"mkdir -p {d}; echo 1 > /tmp/r; ln -s /tmp/r {f}",
                    f"echo 0.25 > {f}", 0.25),
        "fifo": (f"mkdir -p {d}; {bb}mkfifo {f}", "exit 0", 1.0),
        "directory": (f"mkdir -p {f}/x; echo 1 > {f}/x/y; {bb}chmod -R 555 {f}",
                      f"echo 0.25 > {f}", 0.25),
        "huge": (f"mkdir -p {d}; dd if=/dev/zero of={f} bs=1M count=0 seek=10240 2>/dev/null",
                 "exit 1", 0.0),
    }  # fmt: skip
    if profile == "claw":  # a parent directory that is a link to the agent's own reward
        plants["linked-dir"] = (
            "mkdir -p /tmp/x; echo 1 > /tmp/x/reward; ln -s /tmp/x .v",
            "echo 0.25 > .v/reward",
            0.25,
        )
        plants["readonly-root"] = (  # the workspace itself read-only, reward at its top
            f"echo 1 > reward; {bb}chmod 444 reward; {bb}chmod 555 .",
            "echo 0.25 > reward",
            0.25,
        )
    rows = []
    for name, (plant, verify, _) in plants.items():
        row = _job(b, profile, name, plant, verify)
        if name == "readonly-root":
            row["verify"]["reward_file"] = "reward"
        rows.append(row)
    runs = _runs(b, rows)
    for name, (_, _, want) in plants.items():
        run = runs[f"{profile}-{name}"]
        assert run["status"] == "ok", run
        v = run["verify"]
        assert v["reward"] == want, (name, run)
        assert "reward_file_error" not in v["details"], (name, run)


@pytest.mark.parametrize("profile", ["claw", "harbor"])
def test_a_verifier_that_times_out_yields_no_reward(backend, profile):
    """A planted read-only reward and a verifier killed at its timeout (one that writes 1 first,
    too): reward null with the reason, never the file's content."""
    b, bb = backend
    f, d = PLACES[profile]
    plant = f"mkdir -p {d}; echo 1 > {f}; {bb}chmod 444 {f}; {bb}chmod 555 {d}"
    rows = [
        _job(b, profile, "slow", plant, "sleep 60", timeout_s=1),
        _job(b, profile, "writes-then-hangs", "true", f"echo 1 > {f}; sleep 60", timeout_s=1),
    ]
    runs = _runs(b, rows)
    for name in ("slow", "writes-then-hangs"):
        v = runs[f"{profile}-{name}"]["verify"]
        assert v["timed_out"] is True and v["passed"] is False, v
        assert v["reward"] is None, v
        assert "timed out" in v["details"]["no_reward"], v


@pytest.mark.parametrize("profile", ["claw", "harbor"])
def test_a_process_the_agent_left_cannot_write_the_reward(backend, profile):
    """The agent starts a background loop that keeps writing 1 to the reward path and exits: by
    the time the verifier runs (and writes nothing), that process is gone."""
    b, bb = backend
    f, d = PLACES[profile]
    plant = f"mkdir -p {d}; sh -c 'while :; do echo 1 > {f}; sleep 0.01; done' >/dev/null 2>&1 &"
    plant += " sleep 0.2"
    rows = [_job(b, profile, "racer", plant, f"sleep 1; test ! -e {f}")]
    run = _runs(b, rows)[f"{profile}-racer"]
    assert run["verify"]["passed"] is True and run["verify"]["reward"] == 1.0, run


def test_reset_empties_the_verifiers_directories(backend):
    """`verify.reset`: a directory the verifier owns is emptied before it runs, so a Harbor-style
    runner that turns /logs/verifier/reward.json into the reward never sees a planted one."""
    b, bb = backend
    plant = (
        "echo '{\"tests\": 1}' > /logs/verifier/reward.json; "
        f"{bb}chmod 444 /logs/verifier/reward.json; {bb}chmod 555 /logs/verifier"
    )
    runner = (
        "L=/logs/verifier; ls -A $L > /logs/claw/seen; "
        "if [ -f $L/reward.json ]; then cat $L/reward.json > /logs/claw/reward.json; "
        "else echo 0 > /logs/claw/reward.json; fi"
    )
    row = job(
        "reset", command=plant, profile="harbor", workdir="/app",
        mounts=[{"target": "/logs/verifier"}],
        verify={"command": "sh /logs/claw/run.sh", "reward_file": "/logs/claw/reward.json",
                "reset": ["/logs/verifier"],
                "mounts": [{"target": "/logs/claw", "files": {"run.sh": runner}}]},
        collect=["/logs/claw/seen"],
    )  # fmt: skip
    if b.name == "docker":
        row["image"] = IMAGE
    run = _runs(b, [row])["reset"]
    assert run["verify"]["reward"] == 0.0 and run["collected"]["/logs/claw/seen"] == "", run


def test_each_step_of_a_multi_step_job_is_cleared(backend):
    """Steps: every step's verify starts from a cleared reward path. The first step's agent plants
    a read-only reward of 1 and its verifier writes none (exit 1): reward 0, so its min_reward gate
    ends the job; before, the planted 1 passed the gate."""
    b, bb = backend
    f, d = PLACES["harbor"]
    plant = f"echo 1 > {f}; {bb}chmod 444 {f}; {bb}chmod 555 {d}"
    verify = {"command": "exit 1", "reward_file": f}
    row = job(
        "steps", profile="harbor", workdir="/app", mounts=[{"target": "/logs/verifier"}],
        steps=[{"name": "one", "command": plant, "verify": verify, "min_reward": 1.0},
               {"name": "two", "command": "true", "verify": verify}],
    )  # fmt: skip
    if b.name == "docker":
        row["image"] = IMAGE
    run = _runs(b, [row])["steps"]
    assert [s["name"] for s in run["steps"]] == ["one"], run
    assert run["steps"][0]["verify"]["reward"] == 0.0, run


def test_what_the_verifier_leaves_is_read_without_blocking_and_bounded(backend):
    """A fifo or a 10 GB sparse file the verifier itself leaves at the reward path (say, through
    the job's code it runs): the read neither blocks nor reads more than 1 MiB; reward 0 and
    `reward_file_error` says why."""
    b, bb = backend
    f, d = PLACES["claw"]
    rows = [
        _job(b, "claw", "v-fifo", "true", f"mkdir -p {d}; {bb}mkfifo {f}"),
        _job(b, "claw", "v-huge", "true",
             f"mkdir -p {d}; dd if=/dev/zero of={f} bs=1M count=0 seek=10240 2>/dev/null"),
    ]  # fmt: skip
    runs = _runs(b, rows)
    fifo, huge = runs["claw-v-fifo"]["verify"], runs["claw-v-huge"]["verify"]
    assert fifo["reward"] == 0.0 and "not a regular file" in fifo["details"]["reward_file_error"]
    assert huge["reward"] == 0.0 and "neither a number" in huge["details"]["reward_file_error"]
