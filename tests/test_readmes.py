"""Each package README stays runnable: its shell commands and Python snippets run as written.

The commands run in a scratch directory that holds what the READMEs assume is at hand: the
golden records of formats/ as calls.jsonl / outcomes.jsonl, a secret file, the tiny model at
runs/tiny, claw-bench's ClawGym fixture tasks as ClawGym-Bench/, a Harbor registry.json over its Harbor fixtures, and links to tests/ and formats/. Lines that start a server in the background or
need a real harness (claude) are left out; the examples and harness tests cover those. A Python
block whose fence names a file (```python file=verify.py) shows a file, not a snippet to run.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["claw-tree", "claw-sandbox", "claw-proxy", "claw-rl", "claw-bench"]
SKIP = re.compile(r"(^pip |^sudo |^echo |&\s*$|\bclaude\b|^ANTHROPIC_|--compare baseline)")


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def shell_commands(readme: Path) -> list[str]:
    """The README's shell commands, continuation lines joined, comments dropped."""
    commands = []
    for block in _blocks(readme.read_text(), "(?:bash|sh|shell)"):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line and not line.startswith("#") and not SKIP.search(line):
                commands.append(line)
    return commands


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    d = tmp_path_factory.mktemp("readme")
    for name in ("tests", "formats"):
        (d / name).symlink_to(ROOT / name)
    shutil.copy(ROOT / "formats" / "claw.call.v1.example.jsonl", d / "calls.jsonl")
    shutil.copy(ROOT / "formats" / "claw.outcome.v1.example.jsonl", d / "outcomes.jsonl")
    (d / "secret.txt").write_text("my-secret\n")
    (d / "runs").mkdir()
    shutil.copytree(ROOT / "tests" / "fixtures" / "tiny-qwen3", d / "runs" / "tiny")
    # claw-bench's README runs a ClawGym-Bench checkout: its fixture tasks stand in for it
    clawgym = ROOT / "packages" / "claw-bench" / "tests" / "fixtures" / "public" / "clawgym"
    for task in clawgym.iterdir():
        if task.is_dir():
            shutil.copytree(task, d / "ClawGym-Bench" / task.name)
    # ... and a Harbor-layout collection (one task of it broken) for the oracle / nothing example
    shutil.copytree(
        ROOT / "packages" / "claw-bench" / "tests" / "fixtures" / "issue16" / "harbor",
        d / "harbor-tasks",
    )
    # ... and an OfficeQA questions CSV with its corpus (invented fixture questions)
    shutil.copytree(
        ROOT / "packages" / "claw-bench" / "tests" / "data" / "officeqa", d / "officeqa"
    )
    (d / "officeqa" / "officeqa_fixture.csv").rename(d / "officeqa" / "officeqa.csv")
    # ... and a registry in Harbor's format naming two of them, for `plan -d NAME@VERSION`
    tasks = [{"name": n, "git_url": None, "path": f"harbor-tasks/{n}"}
             for n in ("hb-workdir-app", "hb-checksum")]  # fmt: skip
    registry = [{"name": "terminal-bench", "version": "2.0", "tasks": tasks}]
    (d / "registry.json").write_text(json.dumps(registry))
    return d


def _env() -> dict:
    bin_dir = str(Path(sys.executable).parent)
    return dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))


@pytest.mark.slow
@pytest.mark.parametrize("package", PACKAGES)
def test_readme_shell_commands_run(package, scratch):
    """Every shell command of the README (but servers and real harnesses) exits 0."""
    commands = shell_commands(ROOT / "packages" / package / "README.md")
    assert commands, f"{package}/README.md shows no command"
    for cmd in commands:
        if cmd.startswith("claw-rl init-tiny runs/tiny"):
            cmd = cmd.replace(
                "runs/tiny", f"runs/tiny-{package}"
            )  # the fixture copy already sits there
        r = subprocess.run(
            ["bash", "-o", "pipefail", "-c", cmd],
            cwd=scratch,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, f"{package}/README.md: `{cmd}` failed:\n{r.stderr[-2000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("package", PACKAGES)
def test_readme_python_snippets_run(package, scratch):
    """Every Python block of the README runs, given the records it names (calls, outcomes, samples)."""
    prelude = (
        "import json\n"
        "calls = [json.loads(x) for x in open('calls.jsonl')]\n"
        "outcomes = [json.loads(x) for x in open('outcomes.jsonl')]\n"
        "samples = [json.loads(x) for x in open('formats/claw.sample.v1.example.jsonl')]\n"
    )
    blocks = _blocks((ROOT / "packages" / package / "README.md").read_text(), "python")
    for i, block in enumerate(blocks):
        work = scratch / f"py-{package}-{i}"
        work.mkdir()
        for name in ("tests", "formats", "calls.jsonl", "outcomes.jsonl"):
            (work / name).symlink_to(scratch / name)
        (work / "runs").mkdir()  # own outputs: the shell test may have written runs/rl already
        (work / "runs" / "tiny").symlink_to(scratch / "runs" / "tiny")
        r = subprocess.run(
            [sys.executable, "-c", prelude + block],
            cwd=work,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, (
            f"{package}/README.md python block {i} failed:\n{r.stderr[-2000:]}"
        )
