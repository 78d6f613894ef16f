"""One call in progress: sampled ids -> text deltas -> answer events -> the record."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.responses import JSONResponse, StreamingResponse

from claw_proxy import api_responses
from claw_proxy._logprobs import TokenText
from claw_proxy._thinking import reasoning_tokens
from claw_proxy.errors import EngineError
from claw_proxy.messages import (
    Answer,
    ChatRequest,
    ReasoningDelta,
    TextDelta,
    TokenLogprobs,
    ToolCallEvent,
)
from claw_proxy.records import Call, sampling_record
from claw_proxy.render import Detokenizer
from claw_proxy.toolparse import make_parser


def extra(api, req: ChatRequest) -> dict:
    return {"body": req.body} if api is api_responses else {}


async def iterate(run, chunks):
    while True:
        chunk = await run.next_chunk(chunks)
        if chunk is None:
            return
        yield chunk


class ClosingStream(StreamingResponse):
    """A streaming response that releases its call even when the body is never iterated
    (a client gone before the first byte)."""

    def __init__(self, content, *, on_close, **kw) -> None:
        super().__init__(content, **kw)
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


class AnsweredJSON(JSONResponse):
    """A whole answer with work left once its bytes are handed to the connection (the prefix
    cache's update, `Run.remember`): `after` runs right after the last send (and when sending
    fails), in the same step of the event loop, so before this proxy reads another request
    (of this session or any other), and the answer did not wait for it."""

    def __init__(self, content, *, after, **kw) -> None:
        super().__init__(content, **kw)
        self._after = after

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._after()


class Run:
    """One call in progress: sampled ids -> text deltas -> answer events -> record."""

    def __init__(
        self,
        proxy,
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
    ):
        self.proxy, self.api, self.engine, self.req, self.gen_req = proxy, api, engine, req, gen_req
        self.renderer, self.session, self.state, self.seq = renderer, session, state, seq
        self.call_id, self.started, self.rendered = call_id, started, rendered
        self.gen: Any = None  # the engine's Generation, once started
        self._closed = False
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.detok = Detokenizer(renderer.tokenizer)
        self.parser = make_parser(proxy.config.parser, id_prefix=api.CALL_ID_PREFIX)
        self.text, self.reasoning, self.calls = [], [], []
        self.stop_hit = False
        self.deadline = asyncio.get_running_loop().time() + proxy.config.request_timeout
        self._held = ""  # text held back while it may be the start of a stop sequence
        # the request asked for logprobs: OpenAI entries of the completion tokens (not the stop ids)
        self.token_text = TokenText(renderer.tokenizer) if getattr(req, "logprobs", False) else None
        self.lp_entries: list[dict] = []
        self.thinking: dict | None = None  # the record's sampling.thinking (set by the server)
        self._deltas: list[str] = []  # each sampled token's text, and where it ends in the answer
        self._ends: list[int] = []
        self._chars = 0
        self._where: tuple[int, int, int] | None = None  # the record line (`CallWriter.write`)

    def close(self) -> None:
        """Release the session's in-flight slot and stop the engine (idempotent)."""
        if not self._closed:
            self._closed = True
            self.state.in_flight -= 1
            if self.gen is not None:
                self.gen.cancel()

    async def next_chunk(self, chunks):
        if self.stop_hit:
            return None
        try:
            async with asyncio.timeout_at(self.deadline):
                return await anext(chunks)
        except StopAsyncIteration:
            return None
        except TimeoutError:
            self.gen.cancel()
            raise EngineError(
                f"the engine did not finish within {self.proxy.config.request_timeout:g} s",
                status=504,
            ) from None

    def _events(self, evs: list) -> list:
        for ev in evs:
            if isinstance(ev, TextDelta):
                self.text.append(ev.text)
            elif isinstance(ev, ReasoningDelta):
                self.reasoning.append(ev.text)
            elif isinstance(ev, ToolCallEvent):
                self.calls.append(ev.call)
        return evs

    def consume(self, chunk) -> list:
        """Take sampled (id, logprob) pairs; return the answer events they complete.

        The text of a whole chunk goes to the parser at once (its result does not depend on
        how the text is split), so a burst of tokens becomes one delta."""
        if chunk is None or self.stop_hit:
            return []
        stops = self.req.sampling.stop
        parts: list[str] = []
        first_entry = len(self.lp_entries)
        for tok, lp in chunk:
            self.ids.append(tok)
            self.logprobs.append(lp)
            if tok in self.gen_req.stop_ids:
                continue
            if self.token_text is not None:
                self.lp_entries.append(self.token_text.entry(tok, lp))
            delta = self.detok.push(tok)
            self._deltas.append(delta)
            self._chars += len(delta)
            self._ends.append(self._chars)
            if stops and delta:
                # text that could be the start of a stop sequence is held back until it is not
                held = self._held + delta
                cut = min((i for i in (held.find(s) for s in stops) if i >= 0), default=-1)
                if cut >= 0:
                    parts.append(held[:cut])
                    self._held = ""
                    self.stop_hit = True
                    self.gen.cancel()
                    break
                keep = max(
                    (k for s in stops for k in range(1, len(s)) if held.endswith(s[:k])), default=0
                )
                parts.append(held[: len(held) - keep])
                self._held = held[len(held) - keep :]
                continue
            parts.append(delta)
        text = "".join(parts)
        events = self._events(self.parser.feed(text)) if text else []
        if len(self.lp_entries) > first_entry:
            events.insert(0, TokenLogprobs(tuple(self.lp_entries[first_entry:])))
        return events

    def finish_events(self) -> list:
        rest = "" if self.stop_hit else self._held + self.detok.flush()
        evs = self.parser.feed(rest) if rest else []
        return self._events(evs + self.parser.finish())

    def answer(self) -> Answer:
        if self.calls:
            finish = "tool_calls"
        elif (
            self.stop_hit
            or (self.ids and self.ids[-1] in self.gen_req.stop_ids)
            or self.gen.finish == "stop"
        ):
            finish = "stop"
        elif len(self.ids) >= self.gen_req.max_tokens:
            finish = "length"
        else:
            finish = "stop"
        return Answer(
            text="".join(self.text),
            reasoning="".join(self.reasoning),
            tool_calls=tuple(self.calls),
            finish_reason=finish,
            prompt_tokens=len(self.gen_req.prompt_ids),
            completion_tokens=len(self.ids),
            logprobs=tuple(self.lp_entries) if self.token_text is not None else None,
            reasoning_tokens=self._reasoning_tokens() if self.reasoning else 0,
        )

    def _reasoning_tokens(self) -> int:
        p = self.parser
        return reasoning_tokens(
            "".join(self._deltas),
            self._ends,
            getattr(p, "open_think", "<think>"),
            getattr(p, "close_think", "</think>"),
        )

    async def settle(self) -> None:
        """Wait (up to the call's deadline) for the routing of an MoE engine whose generation
        a stop sequence cut short: it comes with the engine's end, after the tokens read."""
        gen = self.gen
        if not getattr(gen, "routes", False) or gen.routing is not None or gen.ended:
            return
        try:
            async with asyncio.timeout_at(self.deadline):
                await gen.settle()
        except TimeoutError:
            pass

    def _kept(self) -> list[int] | None:
        """The engine's kept-set sizes of the call's tokens, when it knows them and some token
        was truncated (top_k / top_p); else None (the record has no `completion_kept`). The
        engine may have sampled past a stop sequence: its list is cut to the tokens read."""
        kept = getattr(self.gen, "kept", None)
        if kept is None or len(kept) < len(self.ids):
            return None
        kept = list(kept[: len(self.ids)])
        return kept if any(k >= 0 for k in kept) else None

    def record(self, answer: Answer, body: dict) -> None:
        proxy, r = self.proxy, self.rendered
        call = Call(
            call_id=self.call_id,
            session=self.session,
            seq=self.seq,
            api=self.api.NAME,
            model=self.req.model,
            policy=self.gen.policy or dict(self.engine.policy),
            engine=getattr(self.gen, "engine_spec", None) or self.engine.spec,
            trainable=self.engine.trainable,
            prompt_ids=self.gen_req.prompt_ids,
            completion_ids=self.ids,
            completion_logprobs=self.logprobs,
            completion_kept=self._kept(),
            prefix=r.prefix_record(),
            finish_reason=answer.finish_reason,
            sampling=sampling_record(
                self.gen_req.temperature,
                self.gen_req.top_p,
                self.gen_req.top_k,
                self.gen_req.forced,
                max_tokens=self.gen_req.max_tokens,
                seed=self.gen_req.seed,
                ignore_eos=self.gen_req.ignore_eos,
                **({"thinking": self.thinking} if self.thinking else {}),
            ),
            usage={
                "prompt_tokens": answer.prompt_tokens,
                "completion_tokens": answer.completion_tokens,
            },
            started_at=self.started,
            ended_at=time.time(),
            tags=dict(self.state.tags),
            request=self.req.body if proxy.config.record_bodies else None,
            response=body if proxy.config.record_bodies else None,
            extra={"teacher": self.engine.teacher} if self.engine.teacher else {},
        )
        where = None
        if proxy.writer:
            routing = (
                proxy.routing.rows(self.gen, call, r.reused_tokens, proxy.writer.path)
                if getattr(self.gen, "routing", None) is not None
                or getattr(self.gen, "routes", False)
                else None
            )
            where = proxy.writer.write(call, prompt_ids_json=r.prompt_json, routing=routing)
            if routing is not None:
                proxy.routing.remember(call, routing)
        proxy.stats["calls_recorded"] += 1
        proxy.stats["prompt_tokens"] += answer.prompt_tokens
        proxy.stats["completion_tokens"] += answer.completion_tokens
        proxy.stats["reused_tokens"] += r.reused_tokens
        proxy.stats["rendered_tokens"] += r.rendered_tokens
        self.state.calls += 1
        self._where = where

    def remember(self, answer: Answer) -> None:
        """Keep the recorded call in the prefix cache (and its session index), so the session's
        next call reuses its ids: done once the answer is sent (`AnsweredJSON`, the end of
        `Proxy._stream`), in the same step of the event loop, so before this proxy reads
        another request."""
        self.proxy.caches[self.engine.tokenizer_dir].remember(
            self.session, self.call_id, self.rendered, answer, self.ids, self._where
        )
