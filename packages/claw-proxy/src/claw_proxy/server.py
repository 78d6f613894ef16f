"""The ASGI app: the three model APIs, sessions, recording, admin, limits.

`Proxy` owns the engines (one per spec), the renderers and per-session prefix caches, the
record writer and the session table; `Proxy.app` is the Starlette app that uvicorn serves.
"""

from __future__ import annotations

import asyncio
import contextvars
import fnmatch
import functools
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

import attrs
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from claw_proxy import _thinking, api_anthropic, api_chat, api_responses
from claw_proxy._bound import PromptBound
from claw_proxy._call import AnsweredJSON, ClosingStream, Run, extra, iterate
from claw_proxy._history import SessionIndex
from claw_proxy._hygiene import TrimAfterBig
from claw_proxy._jsonbody import Split, loads, loads_split, read_limited
from claw_proxy._reparse import ParseMemo
from claw_proxy._responses import error_response
from claw_proxy._routing import RoutingLedger
from claw_proxy._thinking import template_has_switch
from claw_proxy.config import ProxyConfig, call_seed, resolve_sampling, split_spec
from claw_proxy.engines import Engine, GenRequest, PassthroughEngine, ScriptedEngine, VLLMEngine
from claw_proxy.errors import (
    AuthError,
    ClawError,
    ConfigError,
    EngineError,
    LimitError,
    RequestError,
)
from claw_proxy.messages import ChatRequest
from claw_proxy.records import CallWriter, Policy, last_seqs
from claw_proxy.render import TEMPLATE_KWARGS, PrefixCache, Renderer
from claw_proxy.tokens import token_from_headers, verify_token

_BIG_BODY = 1 << 20
# the id prefix of an answer, by API (as the real APIs spell theirs)
#: the response header naming the call's claw.call/v1 ``call_id`` (a judge or client links to it)
CALL_ID_HEADER = "x-claw-call-id"
_ID_PREFIX = {"anthropic.messages": "msg_", "openai.chat": "chatcmpl-", "openai.responses": "resp_"}
_big_request: contextvars.ContextVar[bool] = contextvars.ContextVar("big_request", default=False)


@attrs.define
class _Session:
    tags: dict = attrs.field(factory=dict)
    seq: int = 0
    in_flight: int = 0
    closed: bool = False
    calls: int = 0


class Proxy:
    """The proxy's state and its ASGI app (`self.app`)."""

    def __init__(self, config: ProxyConfig, *, transport=None) -> None:
        self.config = config
        self._transport = transport  # httpx transport for vllm/passthrough engines (tests)
        self.engines: dict[str, Engine] = {}
        self.renderers: dict[str, Renderer] = {}
        self.bounds: dict[str, PromptBound] = {}  # per tokenizer dir: prompt tokens from text
        self.switches: dict[str, bool] = {}  # per tokenizer dir: the template reads enable_thinking
        self.caches: dict[str | None, PrefixCache] = {}
        self.sessions: dict[str, _Session] = {}
        # the last request's messages of each session: re-sent history is not parsed again
        self.parse_memo = ParseMemo(config.prefix_cache_bytes // 4)
        self.workers = ThreadPoolExecutor(config.cpu_workers, thread_name_prefix="claw-proxy-cpu")
        self.big_workers = ThreadPoolExecutor(
            max(1, config.cpu_workers // 2), thread_name_prefix="claw-proxy-big"
        )
        self.stats = {
            "requests": 0,
            "calls_recorded": 0,
            "errors": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "reused_tokens": 0,
            "rendered_tokens": 0,
        }
        self.writer = (
            CallWriter(config.record, config.record_max_bytes, config.record_fsync)
            if config.record
            else None
        )
        self.routing = RoutingLedger(self.stats)  # what MoE calls stored of their routing
        # sessions already in the records: their numbering continues after a restart
        self._last_seq = last_seqs(config.record) if config.record else {}
        # where each recorded call's ids are: a call the prefix cache forgot is read back
        self.history = SessionIndex(config.record)
        self.policy_engine = self._engine(config.engine)
        if config.replicas:
            from claw_proxy._replicas import ReplicaSet

            self.policy_engine = ReplicaSet(
                [self.policy_engine, *(self._engine(s) for s in config.replicas)],
                routing=config.replica_routing,
            )
        for _, spec in config.routes:
            if spec != "policy":
                self._engine(spec)
        self._passthrough_only = all(
            isinstance(e, PassthroughEngine) and e.tokenizer_dir is None
            for e in self.engines.values()
        )
        self.app = self._make_app()

    # --- engines ----------------------------------------------------------------------

    def _renderer(self, directory: str | None) -> Renderer:
        if directory is None:
            raise ConfigError(
                "this engine needs a tokenizer: pass --tokenizer DIR (the policy's HF directory)"
            )
        if directory not in self.renderers:
            self.renderers[directory] = Renderer(directory)
            self.bounds[directory] = PromptBound(self.renderers[directory])
            self.switches[directory] = template_has_switch(self.renderers[directory].tokenizer)
            self.caches[directory] = PrefixCache(
                self.renderers[directory],
                self.config.drift_check_tokens,
                drift_check=self.config.drift_check,
                drift_full_every=self.config.drift_full_every,
                max_bytes=self.config.prefix_cache_bytes,
                index=self.history,
            )
        return self.renderers[directory]

    def _engine(self, spec: str) -> Engine:
        if spec in self.engines:
            return self.engines[spec]
        kind, target = split_spec(spec)
        c = self.config
        if kind == "transformers":
            from pathlib import Path

            from claw_proxy._transformers import TransformersEngine

            if not Path(target).is_dir():
                raise ConfigError(
                    f"engine {spec}: {target} is not a directory (expected an HF model directory "
                    "with config.json and weights)"
                )

            self._renderer(c.tokenizer or target)
            engine: Engine = TransformersEngine(
                target,
                policy_name=c.policy_name,
                max_batch=c.max_batch,
                batch_wait=c.batch_wait,
                dtype=c.dtype,
            )
            engine.tokenizer_dir = c.tokenizer or target
        elif kind == "scripted":
            r = self._renderer(c.tokenizer)
            engine = ScriptedEngine(
                target,
                r.encode,
                r.eos_ids[0],
                policy_name=c.policy_name,
                render_answer=r.render_answer,
            )
            engine.tokenizer_dir = c.tokenizer
        elif kind == "vllm":
            self._renderer(c.tokenizer)
            engine = VLLMEngine(
                target,
                policy_name=c.policy_name,
                transport=self._transport,
                reload_method=c.vllm_reload_method,
                sampling=c.sampling,
            )
            engine.tokenizer_dir = c.tokenizer
        else:
            engine = PassthroughEngine(
                target, api_key=c.upstream_api_key, transport=self._transport
            )
            if c.student_ids:  # a teacher: its calls are recorded in the student's tokenization
                if c.tokenizer is None:
                    raise ConfigError(
                        "--student-ids needs the student's HF directory (tokenizer and chat "
                        "template): pass --tokenizer DIR"
                    )
                self._renderer(c.tokenizer)
                engine.tokenizer_dir = c.tokenizer
        self.engines[spec] = engine
        return engine

    def route(self, model: str) -> Engine:
        for glob, spec in self.config.routes:
            if fnmatch.fnmatchcase(model, glob):
                return self.policy_engine if spec == "policy" else self.engines[spec]
        return self.policy_engine

    # --- auth and sessions --------------------------------------------------------------

    def authenticate(self, request: Request) -> tuple[str, _Session]:
        token = token_from_headers(request.headers)
        if not token:
            raise AuthError(
                "missing API key: send a claw session token as x-api-key or Authorization: Bearer"
            )
        tok = verify_token(token, self.config.secret)
        s = self.sessions.get(tok.session)
        if s is None:
            s = self.new_session(tok.session, dict(tok.tags))
        if s.closed:
            raise AuthError(f"session {tok.session} is closed")
        return tok.session, s

    def new_session(self, session: str, tags: dict | None = None) -> _Session:
        """A session seen for the first time since start (its `seq` continues the records')."""
        s = self.sessions[session] = _Session(
            tags=tags or {}, seq=self._last_seq.pop(session, -1) + 1
        )
        return s

    def _check_admin(self, request: Request) -> None:
        if not self.config.admin_token:
            raise AuthError("the admin API is disabled (start the proxy with --admin-token-file)")
        given = token_from_headers(request.headers) or ""
        import hmac

        if not hmac.compare_digest(given.encode(), self.config.admin_token.encode()):
            raise AuthError("invalid admin token")

    # --- limits -----------------------------------------------------------------------------

    async def check_prompt_bound(self, req: ChatRequest, directory: str | None) -> None:
        """413 before rendering when the request's message text alone proves the prompt longer
        than --max-prompt-tokens (the rules: `_bound`): from its characters, then by counting
        its text's fewest tokens, which stops once past the limit."""
        bound = self.bounds.get(directory) if directory else None
        if bound is None:
            return
        n, chars = bound.at_least(req)
        limit = self.config.max_prompt_tokens
        if n > limit:
            each = (
                f"; {len(bound.texts(req))} messages, each at least one token"
                if bound.separated
                else ""
            )
            raise LimitError(
                f"the prompt has at least {n} tokens ({chars} characters of message text; a "
                f"token of this tokenizer covers at most {bound.bytes_per_token}{each}), over "
                f"this proxy's limit of {limit} (--max-prompt-tokens)",
                status=413,
            )
        floor = bound.floor
        if floor is None or 4 * chars <= limit:  # a token holds a byte, a character <= 4
            return
        texts = bound.texts(req)
        if chars > 65536:  # tens of milliseconds or more: not on the event loop
            n = await self.offload(floor.count, texts, limit)
        else:
            n = floor.count(texts, limit)
        if n > limit:
            raise LimitError(
                f"the prompt has at least {n} tokens (counted in its message text, stopped "
                f"once past the limit), over this proxy's limit of {limit} "
                "(--max-prompt-tokens)",
                status=413,
            )

    def check_prompt_tokens(self, n: int) -> None:
        limit = self.config.max_prompt_tokens
        if n > limit:
            raise LimitError(
                f"the prompt has {n} tokens, over this proxy's limit of {limit} "
                "(--max-prompt-tokens)",
                status=413,
            )

    def thinking(self, req: ChatRequest, directory: str | None) -> dict | None:
        """Pass the request's thinking switch to the chat template while this request renders
        (`enable_thinking`, where the template reads it); the record's `sampling.thinking`.
        RequestError under --thinking refuse when the template has no switch."""
        has_switch = self.switches.get(directory, False) if directory else False
        kwargs, record = _thinking.apply(req.thinking, has_switch, self.config.thinking)
        TEMPLATE_KWARGS.set(kwargs or None)  # this request's context (and its offloaded work)
        return record

    def take_slot(self, session: str, state: _Session) -> None:
        """Count a request in its session's in-flight limit (the caller releases it)."""
        if state.in_flight >= self.config.session_concurrency:
            raise LimitError(
                f"session {session} already has {state.in_flight} requests in flight "
                f"(limit {self.config.session_concurrency})",
                retry_after=1.0,
            )
        state.in_flight += 1

    # --- the model APIs -------------------------------------------------------------------

    async def offload(self, fn, *args):
        """Run CPU work (parsing, rendering, tokenising) on the worker threads, so the event
        loop keeps answering other requests and /healthz meanwhile. The work of a request whose
        body is over 1 MiB goes to threads of its own, so a few huge prompts cannot make every
        other request wait for a free thread."""
        pool = self.big_workers if _big_request.get() else self.workers
        run = contextvars.copy_context().run  # the request's context (template kwargs) goes along
        return await asyncio.get_running_loop().run_in_executor(pool, run, fn, *args)

    async def _body(self, request: Request, known: Split | None = None) -> dict:
        """The request's JSON object. With `known` (the session's last messages), its
        `messages` elements are also read as text (`request.state.split`, None when not), and
        the ones whose text is `known`'s are taken from there unparsed."""
        raw = await read_limited(request, self.config.max_body_bytes, self.config.body_timeout)
        request.state.raw_body = raw  # passthrough forwards the bytes as they came
        big = len(raw) > _BIG_BODY
        _big_request.set(big)  # for this request's task only
        if big:  # its memory is given back to the OS once it is done
            self.app.mark_big(request)
        split = None
        if known is None:
            body = await self.offload(loads, raw) if len(raw) > 65536 else loads(raw)
        elif len(raw) - len(known.region) > 65536:  # what is not known yet is parsed
            body, split = await self.offload(loads_split, raw, known)
        else:
            body, split = loads_split(raw, known)
        request.state.split = split
        if not isinstance(body, dict):
            raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}")
        return body

    def _gen_request(
        self,
        req: ChatRequest,
        prompt_ids: Sequence[int],
        stop_ids,
        max_context: int | None = None,
        tags: dict | None = None,
        session: str = "",
        prompt_json: str = "",
    ) -> GenRequest:
        c, s = self.config, req.sampling
        max_tokens = min(s.max_tokens or c.default_max_tokens, c.max_tokens_cap)
        if max_context:
            if len(prompt_ids) >= max_context:
                raise RequestError(
                    f"the prompt has {len(prompt_ids)} tokens; the model's context is {max_context}",
                    "messages",
                )
            max_tokens = min(max_tokens, max_context - len(prompt_ids))
        temperature, top_p, top_k, forced = resolve_sampling(c, s)  # --sampling force|honor
        return GenRequest(
            prompt_ids=prompt_ids,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            forced=forced,
            seed=s.seed,
            stop_ids=() if s.ignore_eos else tuple(stop_ids),
            ignore_eos=s.ignore_eos,
            model=req.model,
            turn=sum(1 for m in req.messages if m.role == "assistant"),
            tags=tags or {},
            session=session,
            prompt_json=prompt_json,
        )

    async def handle(self, api, request: Request) -> Response:
        self.stats["requests"] += 1
        try:
            session, state = self.authenticate(request)
            known = None if self._passthrough_only else self.parse_memo.known(session)
            body = await self._body(request, known)
            model = body.get("model")
            engine = self.route(model if isinstance(model, str) else "")
            if isinstance(engine, PassthroughEngine):
                from claw_proxy._passthrough import forward

                self.take_slot(session, state)  # released by forward, or when its answer ends
                return await forward(self, api, engine, request, body, session, state)
            split = request.state.split
            if split is None or known is None or api is api_responses:
                req = await self.offload(api.parse, body)
            else:  # the messages taken from the session's last request are not parsed again
                reuse = self.parse_memo.reuse(session, api.NAME, split, known)
                parse = functools.partial(api.parse, body, reuse)
                req = await self.offload(parse) if len(split.fresh) > 16 else parse()
                self.parse_memo.remember(session, req, split)
            self.take_slot(session, state)  # released by _answer
            return await self._answer(api, engine, req, session, state)
        except ClawError as e:
            self.stats["errors"] += 1
            return error_response(api, e)

    async def _answer(
        self, api, engine: Engine, req: ChatRequest, session: str, state: _Session
    ) -> Response:
        cache = self.caches[engine.tokenizer_dir]
        renderer = cache.renderer
        started = time.time()
        try:  # the session's slot (taken by the caller) is held: renders count too
            await self.check_prompt_bound(req, engine.tokenizer_dir)
            thinking = self.thinking(req, engine.tokenizer_dir)
            # a call that extends an earlier one by a few messages is rendered here (less than a
            # millisecond of work), others on the worker threads
            rendered = cache.quick_render(session, req)
            if rendered is None:
                rendered = await self.offload(cache.render, session, req)
            self.check_prompt_tokens(len(rendered.prompt_array))
            gen_req = self._gen_request(
                req,
                rendered.prompt_array,  # the ids as 8-byte ints: not made into Python ints
                renderer.eos_ids,
                getattr(engine, "max_context", None),
                tags=state.tags,
                session=session,
                prompt_json=rendered.prompt_json,
            )
        except BaseException:
            state.in_flight -= 1
            raise
        seq, state.seq = state.seq, state.seq + 1
        if gen_req.seed is None and self.config.seed is not None:  # recorded as sampling.seed
            gen_req = attrs.evolve(gen_req, seed=call_seed(self.config.seed, session, seq))
        call_id = f"call-{uuid.uuid4().hex}"
        resp_id = _ID_PREFIX[api.NAME] + uuid.uuid4().hex[:24]
        run = Run(
            self,
            api,
            engine,
            req,
            gen_req,
            renderer,
            session,
            state,
            seq,
            call_id,
            started,
            rendered,
        )
        run.thinking = thinking
        try:
            gen = engine.generate(gen_req)
            run.gen = gen
            chunks = gen.chunks()
            first = await run.next_chunk(chunks)  # errors before any token become a proper 5xx
        except BaseException:
            run.close()
            raise
        if not req.stream:
            return await self._whole(run, resp_id, first, chunks)
        stream = api.Stream(
            id=resp_id, model=req.model, include_usage=req.include_usage, **extra(api, req)
        )
        if api is api_anthropic:
            stream.prompt_tokens = len(rendered.prompt_array)
        return ClosingStream(
            self._stream(run, stream, first, chunks),
            on_close=run.close,
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", CALL_ID_HEADER: call_id},
        )

    async def _whole(self, run: Run, resp_id: str, first, chunks) -> Response:
        """A non-streamed answer: every chunk consumed, recorded, one JSON body; the prefix
        cache learns the call right after it is sent (`AnsweredJSON`)."""
        api, req = run.api, run.req
        try:
            events = run.consume(first)
            async for chunk in iterate(run, chunks):
                events += run.consume(chunk)
            events += run.finish_events()
            answer = run.answer()
            body = api.response(answer, id=resp_id, model=req.model, **extra(api, req))
            await run.settle()
            run.record(answer, body)
        except BaseException:
            run.close()
            raise
        return AnsweredJSON(
            body,
            headers={CALL_ID_HEADER: run.call_id},
            after=functools.partial(_remember_and_close, run, answer),
        )

    async def _stream(self, run, stream, first, chunks):
        done = None  # the answer, once recorded: the prefix cache learns it in any case
        try:
            for frame in stream.start():
                yield frame
            for ev in run.consume(first):
                for frame in stream.event(ev):
                    yield frame
            try:
                async for chunk in iterate(run, chunks):
                    for ev in run.consume(chunk):
                        for frame in stream.event(ev):
                            yield frame
            except EngineError as e:
                self.stats["errors"] += 1
                for frame in stream.error(e.kind, str(e)):
                    yield frame
                return
            for ev in run.finish_events():
                for frame in stream.event(ev):
                    yield frame
            answer = run.answer()
            await run.settle()
            run.record(
                answer,
                run.api.response(
                    answer, id=stream.id, model=run.req.model, **extra(run.api, run.req)
                ),
            )
            # the prefix cache learns the call once its last frames are handed to the
            # connection (in the same step of the event loop), or when the client leaves
            done = answer
            for frame in stream.finish(answer):
                yield frame
        finally:
            try:
                if done is not None:
                    run.remember(done)
            finally:
                run.close()

    # --- the app ----------------------------------------------------------------------------

    def _make_app(self) -> TrimAfterBig:
        async def chat(request):
            return await self.handle(api_chat, request)

        async def responses(request):
            return await self.handle(api_responses, request)

        async def messages(request):
            return await self.handle(api_anthropic, request)

        from claw_proxy import _admin

        @asynccontextmanager
        async def lifespan(app):
            yield
            await self.aclose()

        routes = [
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/chat/completions", chat, methods=["POST"]),
            Route("/v1/responses", responses, methods=["POST"]),
            Route("/responses", responses, methods=["POST"]),
            Route("/v1/messages", messages, methods=["POST"]),
            *_admin.routes(self),
        ]
        return TrimAfterBig(Starlette(routes=routes, lifespan=lifespan), self.workers)

    async def load_policy(self, policy: Policy) -> dict:
        await self.policy_engine.load_policy(policy)
        return dict(self.policy_engine.policy)

    async def aclose(self) -> None:
        for engine in self.engines.values():
            await engine.aclose()
        if self.writer:
            self.writer.close()
        self.history.close()
        self.workers.shutdown(wait=False, cancel_futures=True)
        self.big_workers.shutdown(wait=False, cancel_futures=True)


def _remember_and_close(run: Run, answer) -> None:
    try:
        run.remember(answer)
    finally:
        run.close()


__all__ = ["Proxy", "error_response"]
