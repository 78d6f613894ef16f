"""claw_tree stays light: importing it must not pull in torch."""

import subprocess
import sys


def test_import_does_not_pull_torch():
    """A fresh interpreter that imports claw_tree (and its CLI) has no torch in sys.modules."""
    code = "import sys, claw_tree, claw_tree.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_all_lists_every_public_name():
    """__all__ names exactly the public, non-module attributes of claw_tree."""
    import types

    import claw_tree

    public = {
        n
        for n, v in vars(claw_tree).items()
        if not n.startswith("_") and not isinstance(v, types.ModuleType)
    }
    assert set(claw_tree.__all__) == public | {"__version__"}
