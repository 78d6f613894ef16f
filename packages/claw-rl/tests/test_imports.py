"""`import claw_rl` stays light: torch and transformers load only when a command or learner needs them."""

import subprocess
import sys
import types

import claw_rl
import pytest


def _loaded(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_import_and_cli_pull_no_torch():
    """A fresh interpreter importing claw_rl and claw_rl.cli has neither torch nor transformers loaded."""
    code = "import sys, claw_rl, claw_rl.cli; print(*[m for m in ('torch', 'transformers') if m in sys.modules])"
    assert _loaded(code) == []


def test_help_pulls_no_torch():
    """`claw-rl --help` and a subcommand's help run without importing torch."""
    code = (
        "import sys\n"
        "from claw_rl.cli import main\n"
        "for args in (['--help'], ['train', '--help']):\n"
        "    try:\n"
        "        main(args)\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, e.code\n"
        "print('LOADED', *[m for m in ('torch', 'transformers') if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.splitlines()[-1].split() == ["LOADED"]


def test_all_is_complete_and_lazy_names_resolve():
    """Every name in __all__ resolves (the lazy ones load their module); every public attribute is in __all__."""
    for name in claw_rl.__all__:
        assert getattr(claw_rl, name) is not None, name
    assert claw_rl.Learner.__module__ == "claw_rl.learner"
    assert claw_rl.save_policy.__module__ == "claw_rl.checkpoint"
    public = {
        n
        for n in dir(claw_rl)
        if not n.startswith("_") and not isinstance(getattr(claw_rl, n), types.ModuleType)
    }
    assert public == set(claw_rl.__all__) - {"__version__"}


def test_unknown_attribute_is_an_attribute_error():
    """A name that is neither defined nor lazy raises AttributeError naming it."""
    with pytest.raises(AttributeError, match="NoSuchThing"):
        claw_rl.NoSuchThing  # noqa: B018
