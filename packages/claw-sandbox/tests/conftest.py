"""Fixtures: backends that skip with a visible reason when missing (the job builders live in
sandbox_testlib.py)."""

import pytest
from claw_sandbox import _cgroup
from claw_sandbox.backends import make_backend


@pytest.fixture(scope="session")
def bwrap():
    backend = make_backend("bwrap")
    reason = backend.unavailable()
    if reason:
        pytest.skip(f"bwrap backend unavailable: {reason}")
    return backend


@pytest.fixture(scope="session")
def process():
    return make_backend("process")


@pytest.fixture(scope="session")
def cgroups():
    support = _cgroup.detect()
    if support.version is None:
        pytest.skip(f"no writable cgroup tree: {support.reason}")
    return support
