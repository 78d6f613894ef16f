"""Several engines serving one policy (`claw-proxy serve --engine A --engine B`).

`ReplicaSet` is an `Engine` over replicas of the same model:

- **Sticky sessions.** A session's calls go to the replica its first call went to, so the
  replica's prefix cache holds the session's earlier turns; a new session goes to the replica
  with the fewest calls in flight (then the fewest sessions, then the first). ``routing="random"``
  picks any live replica per call instead (a baseline for benchmarks).
- **Weight updates.** `load_policy` holds new calls, pushes the policy to every live replica at
  once (each drains its calls, pauses, loads, resumes) and changes the set's version only when
  all of them have it; vLLM calls carry a per-version ``cache_salt`` (engines.cache_salt), so
  prefix-cache blocks never cross versions.
- **Weights over a process group.** A policy with ``transfer``: the live replicas take ranks
  1..W of the learner's group (`_transfer.assign`), each receives the buckets; a replica that
  dies mid-transfer is marked down and the others serve the new version (never one stale).
- **A replica that dies.** A call that fails is checked against the replica's health; when the
  replica is dead it is marked down, its sessions move to live replicas as their next call
  comes, and the call is retried once on another replica. Tokens already passed on are kept:
  the retry continues from the prompt plus those tokens (same policy version, so the record
  stays one draw from one policy), and one record is written as for any call. `health()`
  reports ``degraded`` while any replica is down, ``down`` when none is left.
"""

from __future__ import annotations

import asyncio
import random

import attrs

from claw_proxy import _transfer
from claw_proxy.engines import Engine, Generation, GenRequest
from claw_proxy.errors import ConfigError, EngineError
from claw_proxy.records import Policy

ROUTINGS = ("sticky", "random")


class _Relay(Generation):
    """The generation the proxy sees; it forwards a replica's generation (and on a retry the
    next replica's), so cancelling it cancels the one running.

    An MoE replica's routing is forwarded too: `routes` follows the running replica's
    generation, and its "routing" item (with `experts`) goes on before the relay's "end". So a
    first `cancel` (a stop sequence: the proxy then waits in `settle` for the routing) of a
    routing relay cancels only the replica's generation and lets the relay task pass on what
    that still puts; a second `cancel` (the call closed) or one of a relay that does not route
    also stops the relay task."""

    def __init__(self) -> None:
        super().__init__()
        self.inner: Generation | None = None
        self.engine_spec: str | None = None  # the replica that sampled the tokens
        # the kept-set size of each token passed on (`KeptGeneration.kept`), from the replica that
        # sampled it; None once a replica that does not record them sampled any
        self.kept: list[int] | None = []

    def cancel(self) -> None:
        drain = not self.cancelled and self.routes and self.inner is not None
        super().cancel()
        if self.inner is not None:
            self.inner.cancel()
        if self.task is not None and not drain:
            self.task.cancel()


def _forward_kept(inner: Generation, gen: _Relay, read: int, n: int) -> None:
    """Pass on the kept-set sizes of the `n` tokens `inner` just gave, after the `read` it gave
    before (an engine appends a token's size before it puts the token)."""
    kept = getattr(inner, "kept", None)
    if gen.kept is not None:
        gen.kept = None if kept is None else gen.kept + list(kept[read : read + n])


class ReplicaSet(Engine):
    """One policy served by several engines; see the module docstring."""

    def __init__(self, replicas: list[Engine], routing: str = "sticky", seed: int = 0) -> None:
        super().__init__()
        if len(replicas) < 2:
            raise ConfigError("a replica set needs at least two engines")
        if routing not in ROUTINGS:
            raise ConfigError(f"replica routing must be one of {ROUTINGS}, got {routing!r}")
        if len({r.tokenizer_dir for r in replicas}) > 1:
            raise ConfigError("the replicas of a policy must share one tokenizer")
        self.replicas = replicas
        self.routing = routing
        self.spec = "replicas:" + ",".join(r.spec for r in replicas)
        self.tokenizer_dir = replicas[0].tokenizer_dir
        contexts = [r.max_context for r in replicas if r.max_context]
        self.max_context = min(contexts) if contexts else None
        self.trainable = all(r.trainable for r in replicas)
        self.policy = dict(replicas[0].policy)
        n = len(replicas)
        self.up = [True] * n
        self.down_reason: list[str | None] = [None] * n
        self.in_flight = [0] * n
        self.session_count = [0] * n
        self.sessions: dict[str, int] = {}
        self.retries = 0  # calls retried on another replica after theirs died
        self.moved = 0  # sessions moved off a dead replica
        self._rng = random.Random(seed)
        self._idle = asyncio.Event()
        self._idle.set()
        self._lock = asyncio.Lock()

    # --- routing ------------------------------------------------------------------------

    def pick(self, session: str) -> int:
        """The replica for the next call of `session` (sticky, or random)."""
        live = [i for i, ok in enumerate(self.up) if ok]
        if not live:
            reasons = "; ".join(
                f"{r.spec}: {why}"
                for r, why in zip(self.replicas, self.down_reason, strict=True)
                if why
            )
            raise EngineError(f"every engine replica is down ({reasons})", status=503)
        if self.routing == "random":
            return self._rng.choice(live)
        was = self.sessions.get(session)
        if was is not None and self.up[was]:
            return was
        i = min(live, key=lambda k: (self.in_flight[k], self.session_count[k], k))
        if session:
            if was is not None:
                self.session_count[was] -= 1
                self.moved += 1
            self.sessions[session] = i
            self.session_count[i] += 1
        return i

    def forget(self, session: str) -> None:
        """A closed session: its replica no longer counts it."""
        i = self.sessions.pop(session, None)
        if i is not None:
            self.session_count[i] -= 1

    def mark_down(self, i: int, why: str) -> None:
        if self.up[i]:
            self.up[i] = False
            self.down_reason[i] = why

    def health(self) -> dict:
        """``status`` (ok / degraded / down) and each replica's state."""
        ups = sum(self.up)
        status = "ok" if ups == len(self.up) else "degraded" if ups else "down"
        return {
            "status": status,
            "replicas": [
                {
                    "engine": r.spec,
                    "up": self.up[i],
                    "error": self.down_reason[i],
                    "in_flight": self.in_flight[i],
                    "sessions": self.session_count[i],
                    "policy": dict(r.policy),
                }
                for i, r in enumerate(self.replicas)
            ],
            "retried_calls": self.retries,
            "moved_sessions": self.moved,
        }

    # --- generation -----------------------------------------------------------------------

    def generate(self, req: GenRequest) -> Generation:
        gen = _Relay()
        gen.task = asyncio.ensure_future(self._relay(req, gen))
        return gen

    async def _relay(self, req: GenRequest, gen: _Relay) -> None:
        await self._idle.wait()  # a weight update in progress: go out on the new weights
        sent: list[int] = []  # token ids already passed on
        policy: dict | None = None
        retried = False
        while True:
            try:
                i = self.pick(req.session)
            except EngineError as e:
                gen.put_nowait("error", e)
                return
            replica = self.replicas[i]
            sub = req
            if sent:  # a retry continues after the tokens the harness may already have
                left = req.max_tokens - len(sent)
                if left <= 0:
                    gen.put_nowait("end", "length")
                    return
                sub = attrs.evolve(
                    req, prompt_ids=[*req.prompt_ids, *sent], max_tokens=left, prompt_json=""
                )
            self.in_flight[i] += 1
            try:
                inner = gen.inner = replica.generate(sub)
                before = len(sent)  # tokens this replica's prompt already holds
                gen.routes = inner.routes
                async for chunk in inner.chunks():
                    gen.routes = inner.routes  # an engine may learn it once the call started
                    if policy is None:
                        policy = dict(inner.policy or replica.policy)
                        gen.put_nowait("policy", policy)
                    elif inner.policy is not None and inner.policy != policy:
                        raise _VersionChanged(policy, inner.policy)
                    _forward_kept(inner, gen, len(sent) - before, len(chunk))
                    sent += [t for t, _ in chunk]
                    gen.put_nowait("tokens", chunk)
                if policy is None:
                    gen.put_nowait("policy", dict(inner.policy or replica.policy))
                gen.engine_spec = replica.spec  # the replica that finished the call
                _forward_routing(inner, gen)
                gen.put_nowait("end", inner.finish)
                return
            except _VersionChanged as e:
                gen.put_nowait("error", EngineError(str(e)))
                return
            except EngineError as e:
                dead = not await replica.alive()
                if dead:
                    self.mark_down(i, str(e))
                if not dead or retried or gen.cancelled:
                    gen.put_nowait("error", e)
                    return
                retried = True
                self.retries += 1
            except Exception as e:  # a bug must not leave the call waiting for its timeout
                gen.put_nowait("error", EngineError(f"replica relay failed: {e!r}", status=500))
                return
            finally:
                self.in_flight[i] -= 1
                if gen.inner is not None:
                    gen.inner.cancel()

    # --- weights ------------------------------------------------------------------------------

    async def load_policy(self, policy: Policy) -> None:
        """Push `policy` to every live replica; the set's version changes when all have it.

        New calls wait meanwhile. A replica that dies during the update is marked down (the
        others carry on); one that refuses the weights fails the update with its error, and
        the set keeps its old version (each call's record still names the version of the
        replica that answered it)."""
        async with self._lock:
            self._idle.clear()
            try:
                live = [i for i, ok in enumerate(self.up) if ok]
                results = await asyncio.gather(*self._loads(policy, live), return_exceptions=True)
                failed = []
                for i, res in zip(live, results, strict=True):
                    if isinstance(res, BaseException):
                        if not await self.replicas[i].alive():
                            self.mark_down(i, f"died during the update to v{policy.version}: {res}")
                        else:
                            failed.append(f"{self.replicas[i].spec}: {res}")
                if failed:
                    raise EngineError(
                        f"the policy stays v{self.policy.get('version')}: not every replica "
                        f"loaded v{policy.version} ({'; '.join(failed)})",
                        status=502,
                    )
                if not any(self.up):
                    raise EngineError("every engine replica is down", status=503)
                self.policy = {"name": policy.name, "version": policy.version}
            finally:
                self._idle.set()

    def _loads(self, policy: Policy, live: list[int]) -> list:
        """Each live replica's load of `policy`. With ``transfer`` the group's ranks 1..W go to
        the live replicas in order (each takes its `transfer_ranks`) and the learner is told W + 1
        first; a replica that dies mid-transfer fails only its own load."""
        if policy.transfer is None:
            return [self.replicas[i].load_policy(policy) for i in live]
        firsts, world = _transfer.assign([self.replicas[i].transfer_ranks for i in live])

        async def one(i: int, rank: int, told: asyncio.Future) -> None:
            await told
            await self.replicas[i].receive_policy(policy, rank, world)

        told = asyncio.ensure_future(
            asyncio.to_thread(_transfer.announce, policy.transfer, policy.version, world)
        )
        return [one(i, r, told) for i, r in zip(live, firsts, strict=True)]

    # --- sleep mode (one GPU box: the engines free the GPU while the learner trains) ------------

    #: the sleep level while the live replicas sleep (`sleep`), None while awake
    sleeping: int | None = None

    async def sleep(self, level: int) -> None:
        """Put every live replica to sleep (`VLLMEngine.sleep`); new calls wait until `wake`.
        A replica that does not sleep is marked down: it may still hold its GPU memory, and it
        will not get the next weights. Fails (503) when none sleeps."""
        async with self._lock:
            if self.sleeping is not None:
                return
            self._idle.clear()
            live = [i for i, ok in enumerate(self.up) if ok]
            results = await asyncio.gather(
                *(self._replica_call(i, "sleep", level) for i in live), return_exceptions=True
            )
            for i, res in zip(live, results, strict=True):
                if isinstance(res, BaseException):
                    self.mark_down(i, f"did not sleep: {res}")
            if not any(self.up):
                self._idle.set()
                raise EngineError("no engine replica went to sleep", status=503)
            self.sleeping = level

    async def wake(self, policy: Policy | None = None) -> None:
        """Wake the sleeping replicas, each with `policy`'s weights when given (with
        ``transfer``: ranks 1..W of the learner's group, as `load_policy` assigns them), then
        serve again. A replica that does not wake is marked down and never serves; the set's
        version changes when any woke with `policy`. Fails (503) when none wakes."""
        async with self._lock:
            if self.sleeping is None:
                raise EngineError("the engine replicas are awake: nothing to wake", status=409)
            live = [i for i, ok in enumerate(self.up) if ok]
            results = await asyncio.gather(*self._wakes(policy, live), return_exceptions=True)
            for i, res in zip(live, results, strict=True):
                if isinstance(res, BaseException):
                    self.mark_down(i, f"did not wake{_to(policy)}: {res}")
            if not any(self.up):
                raise EngineError("every engine replica is down (none woke)", status=503)
            if policy is not None:
                self.policy = {"name": policy.name, "version": policy.version}
            self.sleeping = None
            self._idle.set()

    def _wakes(self, policy: Policy | None, live: list[int]) -> list:
        if policy is None or policy.transfer is None:
            return [self._replica_call(i, "wake", policy) for i in live]
        firsts, world = _transfer.assign([self.replicas[i].transfer_ranks for i in live])
        told = asyncio.ensure_future(
            asyncio.to_thread(_transfer.announce, policy.transfer, policy.version, world)
        )

        async def one(i: int, rank: int) -> None:
            await told
            await self._replica_call(i, "wake", policy, rank, world)

        return [one(i, r) for i, r in zip(live, firsts, strict=True)]

    async def _replica_call(self, i: int, method: str, *args) -> None:
        fn = getattr(self.replicas[i], method, None)
        if fn is None:
            raise EngineError(f"engine {self.replicas[i].spec} cannot sleep", status=501)
        await fn(*args)


def _to(policy: Policy | None) -> str:
    return "" if policy is None else f" with v{policy.version}"


def _forward_routing(inner: Generation, gen: _Relay) -> None:
    """Put the replica generation's routing (if it sent one) on the relay, with its `experts`.

    The rows are the answering replica's alone: on a retry it was asked to continue from the
    prompt plus the tokens already passed on, so its rows start at the call's first prompt
    token and cover every token of the call it forwarded (P + C - 1 rows, or more when
    cancelled). A routing that covers fewer is still passed on: the proxy's routing ledger
    stores no routing for it and counts the call in ``routing_missing``."""
    gen.routes = inner.routes
    if inner.routing is not None:
        gen.experts = inner.experts
        gen.put_nowait("routing", inner.routing)


class _VersionChanged(Exception):
    def __init__(self, was: dict, now: dict) -> None:
        super().__init__(
            f"the replica that took over this call serves {now}, the call began on {was}: "
            "not continued across policy versions"
        )
