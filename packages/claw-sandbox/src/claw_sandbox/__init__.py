"""claw-sandbox: isolated, throw-away, parallel job execution (bwrap, docker, process; ray).

Reads `claw.job/v1` records and writes `claw.run/v1` records; see the package README.
"""

from importlib.metadata import version as _version

from claw_sandbox._build import Built
from claw_sandbox._build import build as build_image
from claw_sandbox._oci import unpack as unpack_image
from claw_sandbox.backends import BACKENDS, Backend, doctor, get_backend
from claw_sandbox.errors import (
    BackendUnavailable,
    BuildError,
    ClawError,
    ImageError,
    InfraError,
    JobError,
    JobsFileError,
)
from claw_sandbox.executor import execute_job
from claw_sandbox.records import Job, Run, VerifyResult, read_jobs, read_runs
from claw_sandbox.scheduler import Scheduler, arun_jobs, iter_runs, run_jobs

__version__ = _version("claw-sandbox")
__all__ = [
    "BACKENDS",
    "Backend",
    "BackendUnavailable",
    "BuildError",
    "Built",
    "ClawError",
    "ImageError",
    "InfraError",
    "Job",
    "JobError",
    "JobsFileError",
    "Run",
    "Scheduler",
    "VerifyResult",
    "__version__",
    "arun_jobs",
    "build_image",
    "doctor",
    "execute_job",
    "get_backend",
    "iter_runs",
    "read_jobs",
    "read_runs",
    "run_jobs",
    "unpack_image",
]
