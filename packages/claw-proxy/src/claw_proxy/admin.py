"""A client of the proxy's admin API: reload a policy, rotate the record shards, read the
counters, close a session. Synchronous (httpx); every route is documented in the README.

    with AdminClient("http://127.0.0.1:8000", token) as admin:
        admin.reload("runs/r1/policies.jsonl")      # the newest policy of a claw-rl run
        shards = admin.rotate()["closed"]
        admin.close_session("run1-task3", missing_ok=True)
"""

from __future__ import annotations

from pathlib import Path

import httpx

from claw_proxy._jsonbody import loads
from claw_proxy.errors import AdminError, ClawError, RecordError
from claw_proxy.records import Policy


def read_policy(source: Policy | dict | str | Path) -> Policy:
    """A `claw.policy/v1` record from a record, a dict, or a file: a JSONL file of policy
    records (claw-rl's policies.jsonl, or its `train` output) whose last record is the one to
    serve, or one pretty-printed JSON object (its first line is `{`). The JSON is read as the
    admin API reads a body (no NaN or Infinity); an error names the file and line."""
    if isinstance(source, Policy):
        return source
    if isinstance(source, dict):
        return Policy.from_dict(source)
    path = Path(source)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RecordError(f"{path}: cannot read the policy file: {e.strerror}") from e
    return policy_from_text(text, str(path))


def policy_from_text(text: str, where: str) -> Policy:
    """The policy of JSONL text (its last record) or of one pretty-printed JSON object."""
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise RecordError(f"{where}: no claw.policy/v1 record in it")
    if len(lines) > 1 and lines[0][1].strip() == "{":  # one object over several lines
        return _policy(text, where)
    n, line = lines[-1]
    return _policy(line, f"{where}:{n}")


def _policy(text: str, where: str) -> Policy:
    try:
        d = loads(text, "the record")
    except ClawError as e:
        raise RecordError(f"{where}: {e}") from None
    if not isinstance(d, dict):
        raise RecordError(f"{where}: expected a JSON object (a claw.policy/v1 record)")
    return Policy.from_dict(d, where)


class AdminClient:
    """The admin API of one proxy at `url`, with the proxy's admin token (`--admin-token-file`).

    Each method is one HTTP call and returns the proxy's JSON answer. A refusal (401 bad token,
    404 unknown session, 400 a policy that does not load...) raises `AdminError` with the
    proxy's message and status; a proxy that cannot be reached raises it with status None.
    `transport` is for tests (e.g. `httpx.MockTransport`)."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout: float = 600.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self._client = httpx.Client(
            base_url=self.url,
            headers={"authorization": f"Bearer {token}"},
            timeout=timeout,
            transport=transport,
        )

    def reload(self, policy: Policy | dict | str | Path) -> dict:
        """Serve `policy` (see `read_policy`): the engine loads its weights before the call
        returns. `{"ok": true, "policy": {"name", "version"}, "load_seconds": s}`."""
        return self._call("POST", "/admin/policy", read_policy(policy).to_dict())

    def sleep(self, level: int = 1) -> dict:
        """Put the policy's vLLM engines to sleep (a learner on their GPU is about to train):
        level 1 offloads their weights to CPU memory, 2 frees them. Calls wait until `wake` or
        `reload` (which wakes them with the new weights). `{"ok", "sleeping", "sleep_seconds"}`."""
        return self._call("POST", "/admin/sleep", {"level": level})

    def wake(self) -> dict:
        """Wake the sleeping engines with the weights they had (after a level-1 sleep):
        `{"ok": true, "policy": {"name", "version"}, "wake_seconds": s}`."""
        return self._call("POST", "/admin/wake")

    def rotate(self) -> dict:
        """Close the open record shard: `{"ok": true, "closed": [paths], "lines": n,
        "next": path}`; every call answered before is in a `closed` shard."""
        return self._call("POST", "/admin/rotate")

    def stats(self) -> dict:
        """The proxy's counters: calls, sessions, open sessions, in flight, the served policy,
        per-engine and prefix-cache statistics, records written."""
        return self._call("GET", "/admin/stats")

    def close_session(self, session: str, *, missing_ok: bool = False) -> dict | None:
        """Close a finished rollout's session (its later calls get 401) and free its prefix
        cache: `{"ok": true, "session": id, "calls": n}`. An unknown session is an
        `AdminError` (404), or None with `missing_ok` (no call of it reached this proxy)."""
        try:
            return self._call("POST", f"/admin/sessions/{session}/close")
        except AdminError as e:
            if missing_ok and e.status == 404:
                return None
            raise

    def session(self, session: str) -> dict:
        """A session's state: `{"session", "tags", "calls", "in_flight", "closed"}`."""
        return self._call("GET", f"/admin/sessions/{session}")

    def tag_session(self, session: str, tags: dict) -> dict:
        """Merge `tags` into a session's tags (recorded in its later calls); its state back."""
        return self._call("POST", f"/admin/sessions/{session}", {"tags": tags})

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        try:
            r = self._client.request(method, path, json=body)
        except httpx.HTTPError as e:
            raise AdminError(f"{method} {self.url}{path}: {e}") from e
        try:
            data = r.json()
        except ValueError:
            data = None
        if r.status_code >= 400 or not isinstance(data, dict):
            err = data.get("error") if isinstance(data, dict) else None
            err = err if isinstance(err, dict) else {}
            message = err.get("message") or r.text[:200] or r.reason_phrase
            raise AdminError(
                f"{method} {path}: {r.status_code} {message}", r.status_code, err.get("type")
            )
        return data
