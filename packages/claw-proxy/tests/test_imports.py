"""`import claw_proxy` and its CLI stay light: the transformers engine's torch loads only when that engine starts."""

import subprocess
import sys

HEAVY = ("torch", "transformers", "tokenizers", "vllm")


def test_import_and_cli_pull_no_engine_dependency():
    """A fresh interpreter importing claw_proxy and claw_proxy.cli, and printing --help, loads no torch/transformers."""
    code = (
        "import sys\n"
        "import claw_proxy, claw_proxy.cli\n"
        "try:\n"
        "    claw_proxy.cli.main(['--help'])\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        f"print('LOADED', *[m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.splitlines()[-1].split() == ["LOADED"]


def test_import_and_help_load_no_server_or_http_client():
    """`import claw_proxy.cli` and `--help` load neither the server (starlette, uvicorn) nor the
    HTTP client (httpx): they load with the first name that needs them."""
    code = (
        "import sys\n"
        "import claw_proxy, claw_proxy.cli\n"
        "try:\n"
        "    claw_proxy.cli.main(['--help'])\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "print('LOADED', *[m for m in ('starlette', 'uvicorn', 'httpx') if m in sys.modules])\n"
        "claw_proxy.ProxyServer, claw_proxy.AdminClient\n"
        "print('LOADED', *[m for m in ('starlette', 'uvicorn', 'httpx') if m in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert [line.split() for line in out.splitlines()[-2:]] == [
        ["LOADED"],
        ["LOADED", "starlette", "uvicorn", "httpx"],
    ]


def test_serve_is_the_function_whichever_import_comes_first():
    """`claw_proxy.serve` stays the exported function after its submodule is imported by name
    (which would otherwise bind the package attribute to the module)."""
    code = (
        "import importlib, claw_proxy\n"
        "module = importlib.import_module('claw_proxy.serve')\n"
        "from claw_proxy import serve\n"
        "assert claw_proxy.serve is module.serve is serve and callable(serve)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"
