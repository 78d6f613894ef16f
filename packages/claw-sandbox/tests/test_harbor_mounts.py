"""`profile: "harbor"` verify mounts on bwrap: /tests is a writable copy in the verify step's own
root, as docker copies it into the trial container (a test.sh may move or remove it)."""

from claw_sandbox import run_jobs
from sandbox_testlib import job

# the verifier moves its own tests away (as some Harbor test.sh do) and runs them from there
MOVER = "mv /tests /tmp/moved || exit 3\ntest ! -e /tests || exit 4\nsh /tmp/moved/check.sh\n"
CHECK = (
    'if [ "$(cat /app/out.txt)" = solved ]; then r=1; else r=0; fi\n'
    "echo $r > /logs/verifier/reward.txt\n"
)


def _step(name: str) -> dict:
    return {
        "name": name, "timeout_s": 30,
        "command": "if [ -e /tests ]; then echo present; else echo absent; fi >> /logs/agent/seen",
        "verify": {"command": "bash /tests/test.sh", "reward_file": "/logs/verifier/reward.txt",
                   "mounts": [{"target": "/tests", "files": {"test.sh": MOVER, "check.sh": CHECK,
                                                              "data/x.txt": "x\n"}}]},
    }  # fmt: skip


def test_verify_may_move_tests_away_on_bwrap(bwrap):
    """A verifier that runs `mv /tests /tmp/moved` succeeds on bwrap (it was a mount point:
    'Device or resource busy'); the agent never sees /tests; the reward is still read."""
    j = job(
        "mv", profile="harbor", workdir="/app", command="echo solved > /app/out.txt",
        mounts=[{"target": "/logs/verifier"}],
        verify={"command": "bash /tests/test.sh", "reward_file": "/logs/verifier/reward.txt",
                "mounts": [{"target": "/tests", "files": {"test.sh": MOVER, "check.sh": CHECK}}]},
        collect=["/logs/verifier/**"],
    )  # fmt: skip
    (run,) = run_jobs([j], backend=bwrap)
    assert run["status"] == "ok" and run["verify"]["exit_code"] == 0, run
    assert run["verify"]["reward"] == 1.0
    assert run["collected"]["/logs/verifier/reward.txt"] == "1\n"


def test_each_verify_gets_a_fresh_copy_and_agents_never_see_it(bwrap):
    """Steps: each verify moves /tests away and the next verify finds it whole again; no agent
    step sees /tests (nor what a verifier left in the verify root)."""
    j = job(
        "mv-steps", profile="harbor", workdir="/app", command="true",
        mounts=[{"target": "/logs/agent"}, {"target": "/logs/verifier"}],
        steps=[{**_step("one"), "command": "echo solved > /app/out.txt; " + _step("one")["command"]},
               _step("two")],
        collect=["/logs/agent/**"],
    )  # fmt: skip
    (run,) = run_jobs([j], backend=bwrap)
    assert [s["verify"]["reward"] for s in run["steps"]] == [1.0, 1.0], run
    assert run["collected"]["/logs/agent/seen"] == "absent\nabsent\n"


def test_root_stays_read_only_outside_verify(bwrap):
    """Only a harbor verify step with copied mounts gets a writable root; the command's root
    stays bwrap's read-only tmpfs."""
    j = job(
        "ro", profile="harbor", workdir="/app", command="touch /new-top-level-file",
        mounts=[{"target": "/logs/verifier"}],
        verify={"command": "touch /verify-may-write && test -f /tests/t", "mounts": [
            {"target": "/tests", "files": {"t": ""}}]},
    )  # fmt: skip
    (run,) = run_jobs([j], backend=bwrap)
    assert run["exit_code"] != 0 and run["verify"]["exit_code"] == 0, run
