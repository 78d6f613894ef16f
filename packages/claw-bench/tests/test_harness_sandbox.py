"""`claw-bench harnesses` does not call a harness installed when claw-sandbox cannot run it: found
on PATH here is checked inside the sandbox (`claw-sandbox doctor PROGRAM`), as its jobs will
look for it. claw-sandbox is a stand-in script here (packages never import each other; the real
doctor has its own tests in claw-sandbox)."""

from __future__ import annotations

import json
import os

from claw_bench.cli import main
from click.testing import CliRunner

FAKE_DOCTOR = """#!/bin/sh
# claw-sandbox stand-in: records its arguments, answers `doctor --json ... PROGRAM...`
echo "$@" > "{log}"
echo '{{"name": "bwrap", "kind": "backend", "works": true, "why": "ok"}}'
echo '{{"name": "seen-agent", "kind": "program", "works": true, "why": "{bin}/seen-agent runs in the bwrap sandbox"}}'
echo '{{"name": "hidden-agent", "kind": "program", "works": false, "why": "{bin}/hidden-agent is on PATH here but does not run in the bwrap sandbox: not found on PATH inside the sandbox (show its installation with --ro-path DIR or CLAW_SANDBOX_RO_PATHS)"}}'
exit 1
"""


def _setup(tmp_path, monkeypatch, with_sandbox: bool = True):
    bin_dir, adapters = tmp_path / "bin", tmp_path / "adapters"
    bin_dir.mkdir()
    adapters.mkdir()
    for name in ("seen-agent", "hidden-agent"):
        (bin_dir / name).write_text("#!/bin/sh\necho hi\n")
        (bin_dir / name).chmod(0o755)
        (adapters / f"{name}.toml").write_text(
            f'api = "chat"\nrequires = ["{name}"]\ninstruction = "arg"\n'
            f'command = "{name} {{{{instruction}}}}"\n'
        )
    if with_sandbox:
        doctor = bin_dir / "claw-sandbox"
        doctor.write_text(FAKE_DOCTOR.format(log=tmp_path / "args.txt", bin=bin_dir))
        doctor.chmod(0o755)
    monkeypatch.setenv("CLAW_BENCH_HARNESSES", str(adapters))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin")
    return bin_dir


def _lines(args):
    r = CliRunner().invoke(main, ["harnesses", *args])
    assert r.exit_code == 0, r.output
    return {x.split()[0]: x for x in r.stdout.splitlines()}


def test_harnesses_checks_installs_inside_the_sandbox(tmp_path, monkeypatch):
    """An install the sandbox cannot run is not 'installed': the line says so, names the path,
    why and the flag; one the sandbox runs says it runs there; one doctor call for them all."""
    bin_dir = _setup(tmp_path, monkeypatch)
    lines = _lines(["--backend", "bwrap"])
    hidden = lines["hidden-agent"]
    assert "does NOT run in claw-sandbox" in hidden and " installed" not in hidden, hidden
    assert str(bin_dir / "hidden-agent") in hidden and "--ro-path" in hidden
    assert lines["seen-agent"].endswith("installed (runs in claw-sandbox)")
    assert lines["claw-agent-chat"].endswith("installed")  # needs no executable of its own
    assert (tmp_path / "args.txt").read_text().split() == [
        "doctor", "--json", "--backend", "bwrap", "hidden-agent", "seen-agent"
    ]  # fmt: skip
    rows = {
        row["name"]: row
        for row in map(json.loads, CliRunner().invoke(main, ["harnesses", "--json"]).stdout.split("\n")[:-1])
    }  # fmt: skip
    assert rows["hidden-agent"]["installed"] is True
    assert rows["hidden-agent"]["sandbox"]["works"] is False
    assert rows["seen-agent"]["sandbox"] == {
        "checked": True,
        "works": True,
        "why": f"{bin_dir}/seen-agent runs in the bwrap sandbox",
    }


def test_harnesses_without_claw_sandbox_says_it_did_not_check(tmp_path, monkeypatch):
    """Where claw-sandbox is not installed the listing says the install was not checked in a
    sandbox; --no-sandbox lists what is on PATH here only."""
    _setup(tmp_path, monkeypatch, with_sandbox=False)
    monkeypatch.setattr("sys.executable", str(tmp_path / "no-venv" / "python"))
    lines = _lines([])
    assert (
        "installed here (not checked in a sandbox: claw-sandbox is not installed here)"
        in (lines["hidden-agent"])
    )
    assert _lines(["--no-sandbox"])["hidden-agent"].endswith("installed")
