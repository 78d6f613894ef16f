"""Package boundaries: no claw package imports another; each package has the files it promises."""

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["claw-sandbox", "claw-proxy", "claw-tree", "claw-rl", "claw-bench"]


def _imports(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module


@pytest.mark.parametrize("package", PACKAGES)
def test_package_imports_no_other_claw_package(package):
    """Source and tests of a package import only their own claw_* module."""
    own = package.replace("-", "_")
    offenders = []
    for path in sorted((ROOT / "packages" / package).rglob("*.py")):
        for lineno, module in _imports(path):
            top = module.split(".")[0]
            if top.startswith("claw_") and top != own:
                offenders.append(f"{path.relative_to(ROOT)}:{lineno}: imports {module}")
    assert offenders == []


@pytest.mark.parametrize("package", PACKAGES)
def test_package_layout(package):
    """Each package has pyproject, README, py.typed, tests and a console script of its own name."""
    base = ROOT / "packages" / package
    own = package.replace("-", "_")
    meta = tomllib.loads((base / "pyproject.toml").read_text())
    assert meta["project"]["name"] == package
    assert meta["project"]["scripts"][package] == f"{own}.cli:main"
    deps = " ".join(meta["project"]["dependencies"])
    assert "claw-" not in deps, "packages never depend on each other"
    assert (base / "README.md").read_text().strip()
    assert (base / "src" / own / "py.typed").exists()
    assert list((base / "tests").glob("test_*.py"))


def test_only_claw_rl_and_the_proxy_extra_need_torch():
    """torch sits in claw-rl and behind claw-proxy's `transformers` extra, nowhere else."""
    for package in PACKAGES:
        meta = tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())
        deps = meta["project"]["dependencies"]
        has_torch = any(
            d.split(">")[0].split("=")[0].split("[")[0].strip() == "torch" for d in deps
        )
        assert has_torch == (package == "claw-rl"), package
    proxy = tomllib.loads((ROOT / "packages/claw-proxy/pyproject.toml").read_text())
    assert any(
        d.startswith("torch") for d in proxy["project"]["optional-dependencies"]["transformers"]
    )


def test_no_machine_paths_in_lock():
    """The lock file names no absolute path of a particular machine."""
    lock = (ROOT / "uv.lock").read_text()
    for marker in ("/root/", "/home/", "/work/", "/tmp/", "file://"):
        assert marker not in lock, marker
