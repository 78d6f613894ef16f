"""Programs installed outside the system directories (a venv or an npm prefix under a checkout,
reached through symlinks on PATH, run by a #! interpreter found through env) are shown read-only
inside bwrap sandboxes without any --ro-path, and `claw-sandbox doctor PROGRAM` says whether a
program runs in the sandbox."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from claw_sandbox._hostpaths import command_paths, command_words
from claw_sandbox.cli import main
from claw_sandbox.records import Job
from claw_sandbox.scheduler import Scheduler
from click.testing import CliRunner
from sandbox_testlib import job

SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


@pytest.mark.parametrize(
    ("command", "words"),
    [
        ("mini -t 'Read value.txt'", ["mini"]),
        (
            "command -v mini >/dev/null 2>&1 || { echo 'mini: missing' >&2; exit 127; }; "
            "mini -m m -t 'x' </dev/null",
            ["mini", "echo", "exit", "mini"],
        ),
        (
            "FOO=1 env -i BAR=2 node cli.js | tee log && exec claude -p hi",
            ["node", "tee", "claude"],
        ),
        ("if true; then\n  codex exec 'a b'\nfi", ["true", "codex", "fi"]),
        (["/opt/x/bin/python", "-c", "print(1)"], ["/opt/x/bin/python"]),
        ("echo 'unbalanced", []),
    ],
)
def test_command_words_are_the_programs_a_command_runs(command, words):
    """Each simple command's first word (after VAR=value and exec/env/command -v), never an
    argument such as the quoted instruction; an unparsable string names nothing."""
    assert command_words(command) == words


def _install(root: Path) -> dict[str, Path]:
    """A harness in a venv and a script package run by an interpreter found through env, both
    under `root` (a stand-in for a checkout) and reached through symlinks in root/.tools/bin."""
    venv = root / ".venvs" / "harness"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    script = venv / "bin" / "fake-harness"
    script.write_text(f"#!{venv}/bin/python\nimport sys\nprint('harness ran in', sys.prefix)\n")
    interp = root / ".tools" / "interp" / "fake-node"
    interp.parent.mkdir(parents=True)
    interp.write_text('#!/bin/sh\nexec /bin/sh "$@"\n')
    pkg = root / ".tools" / "npm" / "lib" / "node_modules" / "fake-cli"
    (pkg / "bin").mkdir(parents=True)
    (pkg / "lib.sh").write_text("echo cli ran with its package\n")
    cli = pkg / "bin" / "cli.sh"
    cli.write_text('#!/usr/bin/env fake-node\n. "$(dirname "$(readlink -f "$0")")/../lib.sh"\n')
    bin_dir = root / ".tools" / "bin"
    bin_dir.mkdir()
    for p in (script, interp, cli):
        p.chmod(0o755)
    (bin_dir / "fake-harness").symlink_to(script)
    (bin_dir / "fake-cli").symlink_to(Path("..") / "npm/lib/node_modules/fake-cli/bin/cli.sh")
    (bin_dir / "fake-node").symlink_to(interp)
    return {"root": root, "bin": bin_dir, "venv": venv, "pkg": pkg}


@pytest.fixture
def installed(tmp_path):
    return _install(tmp_path / "checkout")


def test_command_paths_follow_links_venvs_packages_and_interpreters(installed, monkeypatch):
    """The links' directory, the venv (and its base Python), the outermost node_modules, and the
    interpreter named by `#!/usr/bin/env`."""
    path = f"{installed['bin']}:{SYSTEM_PATH}"
    monkeypatch.setenv("PATH", path)  # the runner's PATH
    got = command_paths("command -v fake-harness >/dev/null && fake-harness; fake-cli", path)
    assert str(installed["bin"]) in got and str(installed["venv"]) in got
    assert str(installed["pkg"].parent) in got  # .../node_modules: the package and its deps
    assert str(installed["root"] / ".tools" / "interp") in got
    system = command_paths("echo hi; ls", path)  # what bwrap shows anyway: nothing more
    assert system and all(p.startswith(("/usr/", "/bin")) for p in system), system


def test_command_paths_show_only_what_the_runner_runs(installed, tmp_path, monkeypatch):
    """A job cannot widen the sandbox's view: a PATH entry of the job's own (not the runner's)
    finds nothing, and a path given as a program (a secret's directory) is not followed."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text("k")
    (secret / "key").chmod(0o755)
    monkeypatch.setenv("PATH", SYSTEM_PATH)
    assert command_paths("fake-harness", f"{installed['bin']}:{SYSTEM_PATH}") == []
    assert command_paths(f"{secret}/key; key", f"{secret}:{SYSTEM_PATH}") == []


def test_harness_in_a_checkout_venv_runs_in_bwrap_without_ro_path(
    bwrap, installed, tmp_path, monkeypatch
):
    """What claw-bench plans for a harness found on PATH (a `command -v` preflight, then the
    harness) runs inside bwrap: the venv's script through its symlink, and an env-interpreted
    script that sources a file of its package."""
    path = f"{installed['bin']}:{SYSTEM_PATH}"
    monkeypatch.setenv("PATH", path)  # where the runner found the harness
    command = (
        "command -v fake-harness >/dev/null 2>&1 || { echo 'fake-harness: not installed' >&2; "
        "exit 127; }; fake-harness && fake-cli"
    )
    sched = Scheduler(bwrap, 1, 0, tmp_path / "jobs", lambda msg: None)

    async def run() -> list[dict]:
        row = job("h", command, env={"PATH": path})
        return [r async for r in sched.stream([Job.from_dict(row, "t")])]

    (run_row,) = asyncio.run(run())
    assert run_row["status"] == "ok" and run_row["exit_code"] == 0, run_row
    assert run_row["stdout_tail"] == (
        f"harness ran in {installed['venv']}\ncli ran with its package\n"
    ), run_row


def test_doctor_says_whether_a_program_runs_in_the_sandbox(bwrap, installed, monkeypatch):
    """`claw-sandbox doctor PROGRAM`: ok with where it was found when it runs inside bwrap; NO
    and why (exit 1) for a program that is not on PATH."""
    monkeypatch.setenv("PATH", f"{installed['bin']}:{os.environ['PATH']}")
    r = CliRunner().invoke(main, ["doctor", "--json", "fake-harness", "fake-cli", "no-such-prog"])
    rows = {row["name"]: row for row in map(json.loads, r.stdout.splitlines())}
    assert r.exit_code == 1, r.output
    assert rows["fake-harness"]["works"] and rows["fake-cli"]["works"], rows
    assert str(installed["bin"] / "fake-harness") in rows["fake-harness"]["why"]
    assert not rows["no-such-prog"]["works"] and "not on PATH" in rows["no-such-prog"]["why"]


def test_doctor_says_no_for_a_program_the_sandbox_cannot_run(bwrap, tmp_path, monkeypatch):
    """A program on PATH here that the sandbox's user may not run (mode 0700, while bwrap drops
    to another uid) is NO with the path, the reason seen inside and the flag to look at."""
    if bwrap.owner is None:
        pytest.skip("bwrap runs as this user here (not root): a 0700 program stays runnable")
    private = tmp_path / "private"
    private.mkdir()
    prog = private / "owner-only"
    shutil.copyfile("/bin/true", prog)  # a binary (a shell script here would not be shown)
    prog.chmod(0o700)
    monkeypatch.setenv("PATH", f"{private}:{os.environ['PATH']}")
    r = CliRunner().invoke(main, ["doctor", "--backend", "bwrap", "owner-only"])
    assert r.exit_code == 1, r.output
    line = r.stdout.splitlines()[-1]
    assert line.startswith("NO ") and str(prog) in line and "not readable" in line, line
    assert "--ro-path" in line


def _shim_dir(root: Path) -> Path:
    """A pyenv-style shim directory: shell scripts named after programs that exec a helper of the
    version manager's own, which lives outside anything the sandbox shows."""
    shims = root / ".pyenv" / "shims"
    shims.mkdir(parents=True)
    for name in ("python3", "pip"):
        shim = shims / name
        shim.write_text(
            f'#!/usr/bin/env bash\nexec "{root}/.pyenv/libexec/pyenv" exec {name} "$@"\n'
        )
        shim.chmod(0o755)
    return shims


def test_a_shell_shim_on_the_runners_path_is_not_shown(tmp_path, monkeypatch):
    """A version manager's shims (shell scripts outside a venv) named by a command are not shown:
    showing their directory put the shims in front of the system's python3 inside the sandbox,
    where their helper is missing, and every verifier running `python3` failed."""
    shims = _shim_dir(tmp_path)
    path = f"{shims}:{SYSTEM_PATH}"
    monkeypatch.setenv("PATH", path)
    assert command_paths("python3 verify.py; pip --version", path) == []


def test_a_command_run_through_a_shim_name_finds_the_system_program_in_bwrap(
    bwrap, tmp_path, monkeypatch
):
    """With a shim directory first on the runner's PATH (and the job's), `python3` inside bwrap is
    the system's, as it was before programs were shown automatically."""
    shims = _shim_dir(tmp_path)
    path = f"{shims}:{SYSTEM_PATH}"
    monkeypatch.setenv("PATH", path)
    sched = Scheduler(bwrap, 1, 0, tmp_path / "jobs", lambda msg: None)

    async def run() -> list[dict]:
        row = job("s", "python3 -c 'print(6 * 7)'", env={"PATH": path})
        return [r async for r in sched.stream([Job.from_dict(row, "t")])]

    (run_row,) = asyncio.run(run())
    assert run_row["status"] == "ok" and run_row["exit_code"] == 0, run_row
    assert run_row["stdout_tail"] == "42\n", run_row
