"""Backend registry: `bwrap`, `docker`, `process`, and `auto` (the strongest that works here)."""

from __future__ import annotations

from claw_sandbox.backends.base import Backend, Sandbox
from claw_sandbox.errors import BackendUnavailable

BACKENDS = ("bwrap", "docker", "process")
AUTO_ORDER = ("bwrap", "process")  # docker needs an image per job, so `auto` never picks it


def make_backend(name: str, **options) -> Backend:
    """Construct a backend by name without checking that it works (see `get_backend`)."""
    if name == "bwrap":
        from claw_sandbox.backends.bwrap import BwrapBackend

        return BwrapBackend(**options)
    if name == "docker":
        from claw_sandbox.backends.docker import DockerBackend

        return DockerBackend(**options)
    if name == "process":
        from claw_sandbox.backends.process import ProcessBackend

        return ProcessBackend(**{k: v for k, v in options.items() if k == "default_limits"})
    raise BackendUnavailable(
        f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)} or auto"
    )


def get_backend(name: str | Backend = "auto", **options) -> Backend:
    """A working backend: the named one (BackendUnavailable saying why not) or, for `auto`,
    the strongest that works here: bwrap, else process (which does not isolate)."""
    if isinstance(name, Backend):
        return name
    if name != "auto":
        backend = make_backend(name, **options)
        reason = backend.unavailable()
        if reason:
            raise BackendUnavailable(f"backend {name!r} cannot run here: {reason}")
        return backend
    reasons = []
    for candidate in AUTO_ORDER:
        backend = make_backend(candidate, **(options if candidate == "bwrap" else {}))
        reason = backend.unavailable()
        if reason is None:
            return backend
        reasons.append(f"{candidate}: {reason}")
    raise BackendUnavailable("no backend works here: " + "; ".join(reasons))


def doctor() -> list[dict]:
    """What works on this machine and why not: one dict per backend and per facility."""
    from claw_sandbox import _cgroup

    rows = []
    for name in BACKENDS:
        try:
            backend = make_backend(name)
            reason = backend.unavailable()
        except Exception as exc:  # a broken optional dependency must not break the doctor
            reason = f"{type(exc).__name__}: {exc}"
        rows.append(
            {"name": name, "kind": "backend", "works": reason is None, "why": reason or _good(name)}
        )
    cg = _cgroup.detect()
    rows.append({"name": "cgroups", "kind": "limits", "works": cg.version is not None,
                 "why": f"{cg.reason}: memory/pids/cpu limits and kill-all per job" if cg.version
                 else f"{cg.reason}; falling back to rlimits (no cpu limit, pids per user)"})  # fmt: skip
    import shutil

    socat = shutil.which("socat")
    rows.append({"name": "socat", "kind": "network", "works": True,
                 "why": "in-sandbox proxy forwarder" if socat
                 else "not installed: the in-sandbox forwarder uses Python instead"})  # fmt: skip
    try:
        auto = get_backend("auto").name
    except BackendUnavailable as exc:
        auto = f"none ({exc})"
    rows.append({"name": "auto", "kind": "choice", "works": True, "why": f"auto picks {auto}"})
    return rows


def _good(name: str) -> str:
    return {
        "bwrap": "namespaces (pid, net, mount, ipc, uts), allow-list host view (read-only "
        "system dirs), seccomp filter, separate uid",
        "docker": "container per job; the job seccomp filter; network none or only the proxy",
        "process": "works everywhere but does NOT isolate (trusted code only)",
    }[name]


__all__ = ["BACKENDS", "Backend", "Sandbox", "doctor", "get_backend", "make_backend"]
