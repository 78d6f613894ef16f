"""A claw.job/v1 under construction: typed fields that an execution profile replaces (never edits
in place), written out once as the record's dict."""

from __future__ import annotations

from typing import Any

import attrs

from claw_bench.records import JOB


@attrs.frozen(kw_only=True)
class JobSpec:
    """The fields of one claw.job/v1 (docs/formats.md); None leaves an optional field out.

    A profile derives its job with ``attrs.evolve(spec, ...)``; :meth:`to_dict` writes the
    fields in the record's documented order, so the same job is always the same JSON line.
    """

    job_id: str
    workspace: dict[str, Any]  # job_files() entries: path -> text or {"content_b64": ...}
    setup: list[str]
    command: str
    env: dict[str, str]
    timeout_s: float
    network: dict[str, Any]
    collect: list[str]
    meta: dict[str, Any]
    verify: dict[str, Any] | None = None
    image: str | None = None
    profile: str | None = None
    workdir: str | None = None
    mounts: list[dict[str, Any]] | None = None
    steps: list[dict[str, Any]] | None = None
    image_run: list[str] | None = None
    image_env: dict[str, str] | None = None
    limits: dict[str, Any] | None = None
    services: list[dict[str, Any]] | None = None  # sidecars (Harbor compose, docker backend)

    def to_dict(self) -> dict[str, Any]:
        """The claw.job/v1 dict."""
        job: dict[str, Any] = {
            "schema": JOB,
            "job_id": self.job_id,
            "workspace": {"files": self.workspace},
            "setup": self.setup,
            "command": self.command,
            "env": self.env,
            "timeout_s": self.timeout_s,
            "network": self.network,
            "collect": self.collect,
            "meta": self.meta,
        }
        optional = (
            ("verify", self.verify),
            ("image", self.image),
            ("profile", self.profile),
            ("workdir", self.workdir),
            ("mounts", self.mounts),
            ("steps", self.steps),
            ("image_run", self.image_run),
            ("image_env", self.image_env),
            ("limits", self.limits),
            ("services", self.services),
        )
        job.update((k, v) for k, v in optional if v is not None)
        return job
