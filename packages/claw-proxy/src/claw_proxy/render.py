"""Rendering conversations into token ids, with per-session prefix reuse.

The proxy owns the chat template and the tokenizer of the policy's HF directory. A request
whose messages extend an earlier call of the same session (its messages plus the answer the
proxy gave) is not re-rendered: its prompt is that call's prompt ids + sampled completion ids
+ the rendering of the new messages only, so turn k+1's prompt has turn k's tokens as an
exact prefix, and the work per turn grows with the new messages, not with the context.

The new messages are rendered with the template itself, after a tiny stand-in conversation
that ends in an assistant message: the text after that assistant message's content is the
template's continuation (its end-of-turn tokens, the new turns and the generation prompt).
"""

from __future__ import annotations

import contextvars
import threading
from array import array
from collections import OrderedDict

import attrs

from claw_proxy._history import Entry, SessionIndex
from claw_proxy.config import DRIFT_CHECKS
from claw_proxy.errors import ConfigError, RequestError
from claw_proxy.messages import Answer, ChatRequest, Message, ToolCall

_MARK = "\u2063claw-anchor\u2063"


# keyword arguments for the chat template while this request is rendered (the harness's
# thinking switch as `enable_thinking`, where the template reads it); set per request by the
# server, in that request's context only
TEMPLATE_KWARGS: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "template_kwargs", default=None
)


@attrs.frozen(kw_only=True)
class Rendered:
    # the ids as a list, made from prompt_array when first asked for (`prompt_ids`): a prompt
    # built by reuse goes to the engine and the record as the array and its JSON, so its ids
    # are not made into Python ints on every call
    _ids: list[int] | None = attrs.field(default=None, alias="prompt_ids", repr=False)
    reused_tokens: int
    rendered_tokens: int
    parent_call: str | None
    fresh_render_matches: bool | None
    drift_check: str | None = None  # "boundary" / "full": what fresh_render_matches compared
    keys: list[str] = attrs.field(factory=list, repr=False)  # history keys of the request
    prompt_array: array = attrs.field(factory=lambda: array("q"), repr=False)
    prompt_json: str = attrs.field(default="", repr=False)  # "1,2,3": the ids as JSON, cached
    # the request continues call `fork_of`, whose ids could not be reused (`fork_reason`): the
    # prompt was rendered fresh from there on and may differ from what that call saw
    fork_reason: str | None = None
    fork_of: str | None = None

    @property
    def prompt_ids(self) -> list[int]:
        if self._ids is None:
            object.__setattr__(self, "_ids", self.prompt_array.tolist())
        return self._ids  # type: ignore[return-value]

    def prefix_record(self) -> dict:
        """The `prefix` object of a `claw.call/v1` recorded on this rendering."""
        out = {
            "reused_tokens": self.reused_tokens,
            "rendered_tokens": self.rendered_tokens,
            "parent_call": self.parent_call,
            "fresh_render_matches": self.fresh_render_matches,
        }
        if self.drift_check:
            out["drift_check"] = self.drift_check
        if self.fork_reason:
            out["fork_reason"] = self.fork_reason
            out["fork_of"] = self.fork_of
        return out


def _ids_json(ids) -> str:
    if len(ids) <= 65536:
        return ",".join(map(str, ids))
    # in slices: one C call over a million ids would hold the GIL (and stall the event loop,
    # this runs on a worker thread) for a quarter of a second or more
    return ",".join(",".join(map(str, ids[i : i + 65536])) for i in range(0, len(ids), 65536))


def _join(a: str, b: str) -> str:
    return f"{a},{b}" if a and b else a or b


class _Ids:
    """Token ids, their JSON and history keys, shared by a line of calls: a call that extends
    another holds the longer copy and the shorter one becomes a prefix of it, so a session's
    memory follows its distinct tokens, not its number of turns."""

    __slots__ = ("array", "json", "keys", "refs")

    def __init__(self, ids: array, ids_json: str, keys: list[str]) -> None:
        self.array = ids  # prompt ids + completion ids (8 bytes a token)
        self.json = ids_json  # the same ids as JSON text without brackets: records reuse it
        self.keys = keys  # context key, then one key per message, the answer's last
        self.refs = 0  # branches using it

    @property
    def nbytes(self) -> int:
        """What this holds in memory, near enough (ids, their JSON, the keys)."""
        return len(self.array) * 8 + len(self.json) + 90 * len(self.keys) + 200


_BRANCH_BYTES = 200  # a branch's own fields


@attrs.define
class _Branch:
    call_id: str
    ids: _Ids
    n_tokens: int  # this call's prompt + completion: the first n_tokens of ids.array
    n_chars: int  # ... their JSON: the first n_chars of ids.json
    n_keys: int  # ... its history keys: the first n_keys of ids.keys
    prompt_len: int  # how many of token_ids are the prompt (the rest was sampled)
    ended_with_eos: bool
    superseded: bool = False  # a later call of the session extends this one

    @property
    def token_ids(self) -> array:
        a = self.ids.array
        return a if len(a) == self.n_tokens else a[: self.n_tokens]

    @property
    def ids_json(self) -> str:
        j = self.ids.json
        return j if len(j) == self.n_chars else j[: self.n_chars]

    @property
    def keys(self) -> list[str]:
        k = self.ids.keys
        return k if len(k) == self.n_keys else k[: self.n_keys]


class Renderer:
    """Chat template + tokenizer of one HF directory."""

    def __init__(self, directory: str) -> None:
        from pathlib import Path

        if not Path(directory).is_dir():
            raise ConfigError(
                f"{directory}: no such directory (expected the policy's HF directory, with its "
                "tokenizer files and chat template)"
            )
        try:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(directory)
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot load a tokenizer from {directory}: {e}") from e
        if not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError(f"the tokenizer in {directory} has no chat_template")
        self.directory = directory
        self.eos_ids = self._eos_ids(directory)
        eos = self.tokenizer.eos_token_id
        self.eos_text = self.tokenizer.convert_ids_to_tokens(eos) if eos is not None else None
        self._lock = threading.Lock()
        self._boundary = self._boundary_state()
        self._split_ids = self._split_eos_ids()

    def _boundary_state(self) -> tuple[str, list[int], list[int]] | None:
        """What the boundary drift check needs, computed once: the text and ids of a stand-in
        user turn with the generation prompt, and the generation prompt's own ids. None when
        the generation prompt does not start with an added token (then the text before it may
        merge with it, and only a full re-render can tell)."""
        anchor = [{"role": "user", "content": "u"}]
        try:
            head = self._template(anchor, None, True)
            closed = self._template(anchor, None, False)
        except RequestError:  # a template that refuses a lone user turn: full checks only
            return None
        head_ids, closed_ids = self.encode(head), self.encode(closed)
        gen_ids = head_ids[len(closed_ids) :]
        added = set(self.tokenizer.get_added_vocab().values())
        if (
            not head.startswith(closed)
            or head_ids[: len(closed_ids)] != closed_ids
            or not gen_ids
            or gen_ids[0] not in added
        ):
            return None
        return head, head_ids, gen_ids

    def _split_eos_ids(self) -> frozenset[int]:
        """The eos ids after which the text is tokenised on its own: the Rust tokenizer splits
        its input at every match of an added token that is not normalised before it normalises,
        pre-tokenises and encodes each piece by itself, so when such a token has no `rstrip`
        (it does not take the whitespace after it) and nothing truncates or pads, the ids of
        the text after it are those of that text encoded alone."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None or backend.truncation is not None or backend.padding is not None:
            return frozenset()
        added = backend.get_added_tokens_decoder()
        return frozenset(
            i
            for i in self.eos_ids
            if i in added and not added[i].rstrip and not added[i].normalized
        )

    def _eos_ids(self, directory: str) -> tuple[int, ...]:
        import json
        from pathlib import Path

        ids = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        gen = Path(directory) / "generation_config.json"
        if gen.exists():
            eos = json.loads(gen.read_text()).get("eos_token_id")
            ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if not ids:
            raise ConfigError(f"the tokenizer in {directory} has no eos token")
        return tuple(sorted(ids))

    def _template(self, messages: list[dict], tools: list[dict] | None, gen: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                messages,
                tools=tools or None,
                add_generation_prompt=gen,
                tokenize=False,
                **(TEMPLATE_KWARGS.get() or {}),
            )
        except Exception as e:  # jinja raises its own errors for shapes the template refuses
            raise RequestError(
                f"the chat template cannot render this conversation: {e}", "messages"
            ) from e

    def encode(self, text: str) -> list[int]:
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            return self._encoding(backend, text).ids
        return self.tokenizer.encode(text, add_special_tokens=False)

    @staticmethod
    def _encoding(backend, text: str):
        # the Rust tokenizer directly: same ids, less overhead. `encode_batch` (unlike `encode`)
        # releases the GIL while it works, so a long text tokenised in a worker thread does not
        # stall the event loop; a short one (a few ms at most) skips its thread hand-off
        if len(text) < 16384:
            return backend.encode(text, add_special_tokens=False)
        return backend.encode_batch([text], add_special_tokens=False)[0]

    def render_answer(self, text: str, tool_calls=()) -> list[int]:
        """The ids of an assistant answer (``text`` and ``(name, arguments)`` tool calls) as the
        chat template writes that turn into history, up to and including its eos token: what
        the policy would have to sample to give this answer. ConfigError when the template does
        not end an assistant turn with the eos token."""
        msg = Message(
            role="assistant",
            content=text,
            tool_calls=tuple(
                ToolCall(id=f"call_{i}", name=name, arguments=dict(args))
                for i, (name, args) in enumerate(tool_calls)
            ),
        )
        anchor = [{"role": "user", "content": "u"}]
        head = self._template(anchor, None, True)
        full = self._template([*anchor, msg.to_template()], None, False)
        end = full.rfind(self.eos_text) if self.eos_text else -1
        if not full.startswith(head) or end < len(head):
            raise ConfigError(
                f"the chat template of {self.directory} does not write an assistant turn as the "
                "generation prompt followed by the answer and the eos token"
            )
        return self.encode(full[len(head) : end]) + [self.tokenizer.eos_token_id]

    def render_full(self, req: ChatRequest) -> list[int]:
        msgs = [m.to_template() for m in req.messages]
        return self.encode(self._template(msgs, list(req.tools), True))

    def boundary_matches(
        self, prompt_ids, completion_ids, resent: Message, new: list[Message], tail: list[int]
    ) -> bool | None:
        """Drift check in O(new tokens): whether a full re-render would give the same ids from
        the generation prompt that ends `prompt_ids` on, i.e. the answer as the client sent it
        back (`resent`) against the sampled `completion_ids`, the `new` messages against
        `tail`, and no token merged across either boundary. The template renders the answer
        and the new messages after a stand-in user turn, so the work does not grow with the
        context. None when this template has no added token to anchor the boundary."""
        if self._boundary is None:
            return None
        head, head_ids, gen_ids = self._boundary
        if len(prompt_ids) < len(gen_ids) or list(prompt_ids[-len(gen_ids) :]) != gen_ids:
            return False  # the reused prompt does not end with the generation prompt
        msgs = [{"role": "user", "content": "u"}, resent.to_template()]
        text = self._template(msgs + [m.to_template() for m in new], None, True)
        if not text.startswith(head):
            return None
        ids = self.encode(text)
        n = len(head_ids)
        return ids[:n] == head_ids and ids[n:] == [*completion_ids, *tail]

    def boundary_continuation(
        self,
        prompt_ids,
        completion_ids: list[int],
        resent: Message,
        new: list[Message],
        tail: str | None = None,
    ) -> list[int] | None:
        """The boundary drift check and the continuation's ids from one render and one
        tokenisation: when `boundary_matches` would be True, the ids of the continuation (the
        text after the answer's eos token: its end of turn, the new messages, the generation
        prompt) taken from the check's own encoding, where that eos token splits them off; None
        when the check does not pass or the split cannot be proven (then the caller renders the
        continuation by itself, `continuation_text`, encodes it and runs `boundary_matches`).

        Exact: the ids after an eos token in `_split_ids` are those of the text after it encoded
        alone. That text is the continuation as the template writes it after this very answer;
        `continuation_text` writes it after a stand-in answer, the same text for templates that
        write each turn by itself (the Qwen3 family; a template that does not shows as drift on
        the checks that render the real history). With `tail` (that continuation text) it must
        also end the render exactly there."""
        if (
            self._boundary is None
            or not completion_ids
            or completion_ids[-1] not in self._split_ids
        ):
            return None
        head, head_ids, gen_ids = self._boundary
        if len(prompt_ids) < len(gen_ids) or list(prompt_ids[-len(gen_ids) :]) != gen_ids:
            return None
        msgs = [{"role": "user", "content": "u"}, resent.to_template()]
        text = self._template(msgs + [m.to_template() for m in new], None, True)
        if not text.startswith(head) or (tail is not None and not text.endswith(tail)):
            return None
        enc = self._encoding(self.tokenizer.backend_tokenizer, text)
        ids = enc.ids
        n = len(head_ids)
        j = n + len(completion_ids)
        if (
            len(ids) < j
            or ids[:n] != head_ids
            or ids[n:j] != completion_ids
            or (tail is not None and enc.offsets[j - 1][1] != len(text) - len(tail))
        ):
            return None
        return ids[j:]

    def continuation_text(self, new: list[Message], ended_with_eos: bool) -> str | None:
        """The text that follows an assistant answer: its end of turn, the new messages, the
        generation prompt. None when this template does not end an assistant turn with its eos
        token."""
        anchor = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _MARK}]
        text = self._template(anchor + [m.to_template() for m in new], None, True)
        i = text.rfind(_MARK)
        if i < 0:
            return None
        tail = text[i + len(_MARK) :]
        if ended_with_eos:
            if not self.eos_text or not tail.startswith(self.eos_text):
                return None
            tail = tail[len(self.eos_text) :]
        return tail

    def render_continuation(self, new: list[Message], ended_with_eos: bool) -> list[int] | None:
        """Ids that follow an assistant answer (`continuation_text`, encoded)."""
        text = self.continuation_text(new, ended_with_eos)
        return None if text is None else self.encode(text)


class PrefixCache:
    """Per-session memory of earlier calls, to build prompts by prefix reuse.

    Memory is bounded by `max_bytes`: sessions are kept in least-recently-used order and the
    coldest are forgotten first when the branches held pass the budget. A forgotten call loses
    nothing but time: `index` (the session index next to the record series) knows the history
    it answered and where its record line is, and a request that continues it reads its ids
    back from there (`recovered_calls`). Where they cannot be read back (no record series, a
    shard moved away) the request is rendered fresh and its `Rendered` says so (`fork_reason`,
    counted in `forks`): a re-render is not what the model saw (dropped reasoning, templates
    that write older turns differently).
    """

    def __init__(
        self,
        renderer: Renderer,
        drift_check_tokens: int = 16384,
        drift_check: str = "boundary",
        drift_full_every: int = 0,
        branches_per_session: int = 32,
        max_sessions: int = 10000,
        max_bytes: int = 1 << 30,
        index: SessionIndex | None = None,
    ) -> None:
        self.renderer = renderer
        self.index = index if index is not None else SessionIndex(None)
        self.recovered_calls = 0  # forgotten calls read back from the records and reused
        self.forks: dict[str, int] = {}  # calls rendered fresh although they continue a call
        if drift_check not in DRIFT_CHECKS:
            raise ConfigError(f"drift_check must be one of {', '.join(DRIFT_CHECKS)}")
        self.drift_check_tokens = drift_check_tokens
        self.drift_check = drift_check
        self.drift_full_every = drift_full_every
        self._reuses = 0  # calls built by reuse so far (every Nth gets a full re-render)
        # a boundary check that passes also gives the continuation's ids (one render and one
        # tokenisation of the new messages, not two); False: always the two-pass path
        self.one_pass = True
        self.branches_per_session = branches_per_session
        self.max_sessions = max_sessions
        self.max_bytes = max_bytes
        self._sessions: OrderedDict[str, list[_Branch]] = OrderedDict()
        self._lock = threading.Lock()
        self.nbytes = 0  # bytes held by every branch of every session
        self.evicted_sessions = 0

    def _attach(self, branch: _Branch, ids: _Ids) -> None:
        ids.refs += 1
        if ids.refs == 1:
            self.nbytes += ids.nbytes
        branch.ids = ids

    def _detach(self, branch: _Branch) -> None:
        branch.ids.refs -= 1
        if branch.ids.refs == 0:
            self.nbytes -= branch.ids.nbytes

    def _drop(self, branch: _Branch) -> None:
        self._detach(branch)
        self.nbytes -= _BRANCH_BYTES

    def _drop_session(self, session: str) -> None:
        for b in self._sessions.pop(session):
            self._drop(b)

    def stats(self) -> dict:
        with self._lock:
            return {
                "bytes": self.nbytes,
                "max_bytes": self.max_bytes,
                "sessions": len(self._sessions),
                "evicted_sessions": self.evicted_sessions,
                "recovered_calls": self.recovered_calls,
                "forks": dict(self.forks),
                "session_index": self.index.stats(),  # shared by the caches of one proxy
            }

    def _keys(self, req: ChatRequest) -> list[str]:
        return [req.context_key(), *map(Message.key, req.messages)]

    def _match(self, session: str, req: ChatRequest) -> tuple[list[str], _Branch | None]:
        """The request's history keys and the longest earlier call it extends (None: none)."""
        if not req.messages:
            raise RequestError("at least one message is required", "messages")
        if req.messages[-1].role == "assistant":
            raise RequestError(
                "the last message is from the assistant (prefill is not supported)", "messages"
            )
        keys = self._keys(req)
        best = None
        with self._lock:
            if session in self._sessions:
                self._sessions.move_to_end(session)  # recently used: evicted last
            # the longest call this request extends (the earliest of equals): newest first, so
            # the older calls it extends are passed over without comparing their keys
            for b in reversed(self._sessions.get(session, ())):
                n = b.n_keys
                if n < len(keys) and (best is None or n >= best.n_keys) and keys[:n] == b.keys:
                    best = b
        return keys, best

    def quick_render(self, session: str, req: ChatRequest, max_new: int = 8) -> Rendered | None:
        """`render`'s answer when it is small, certain work: the request extends an earlier call
        by at most `max_new` messages whose continuation is under 16K characters, and the
        boundary check passes in one pass (no drift, no full re-render due). None otherwise,
        with nothing changed: then `render` (on a worker thread) does it all. Cheap enough to
        run on the event loop, which saves the request two thread hand-offs."""
        if self.drift_check != "boundary" or not self.one_pass or self._full_due():
            return None
        keys, best = self._match(session, req)
        if best is None or len(req.messages) - best.n_keys + 1 > max_new:
            return None
        if self.index.candidate(session, self.renderer.directory, keys, best.n_keys):
            return None  # a longer call was forgotten: `render` reads it back
        new = list(req.messages[best.n_keys - 1 :])
        if sum(len(m.content) for m in new) >= 16384:  # long work: on a worker thread
            return None
        reused = best.token_ids
        tail = self._one_pass_tail(req, best, reused, new)
        if tail is None or not self._take_boundary_reuse():
            return None
        return self._reused(keys, best, reused, tail, True, "boundary")

    def _full_due(self) -> bool:
        """Whether the next reuse is the `drift_full_every`-th (its check is a full render)."""
        n = self.drift_full_every
        return n > 0 and (self._reuses + 1) % n == 0

    def _take_boundary_reuse(self) -> bool:
        """Count a reuse checked at the boundary, as `_drift_mode` counts it; False (nothing
        counted) when it is the one due a full check."""
        with self._lock:
            if self._full_due():
                return False
            self._reuses += 1
            return True

    def _reused(
        self,
        keys: list[str],
        best: _Branch,
        reused: array,
        tail: list[int],
        matches: bool | None,
        check: str | None,
        prompt: array | None = None,
        fork: tuple[str, str] | None = None,
    ) -> Rendered:
        return Rendered(
            reused_tokens=len(reused),
            rendered_tokens=len(tail),
            parent_call=best.call_id,
            fresh_render_matches=matches,
            drift_check=check,
            keys=keys,
            prompt_array=reused + array("q", tail) if prompt is None else prompt,
            prompt_json=_join(best.ids_json, _ids_json(tail)),
            fork_reason=fork[0] if fork else None,
            fork_of=fork[1] if fork else None,
        )

    def _one_pass_tail(
        self, req: ChatRequest, best: _Branch, reused: array, new: list
    ) -> list[int] | None:
        """The continuation's ids from the boundary check's own render and tokenisation, or
        None when the check does not pass in one pass (drift, no eos): then the two-pass path
        decides."""
        p = best.prompt_len
        return self.renderer.boundary_continuation(
            reused[max(0, p - 64) : p],
            reused[p:].tolist(),
            req.messages[best.n_keys - 2],
            new,
        )

    def render(self, session: str, req: ChatRequest) -> Rendered:
        keys, best = self._match(session, req)
        best, fork = self._recover(session, keys, best)
        if best is not None:
            new = list(req.messages[best.n_keys - 1 :])
            reused = best.token_ids  # a copy when best is a prefix of a longer call
            if self.drift_check == "boundary" and self.one_pass and not self._full_due():
                tail = self._one_pass_tail(req, best, reused, new)
                if tail is not None and self._take_boundary_reuse():
                    return self._count(
                        self._reused(keys, best, reused, tail, True, "boundary", fork=fork)
                    )
            text = self.renderer.continuation_text(new, best.ended_with_eos)
            if text is not None:
                mode = self._drift_mode()
                tail = self.renderer.encode(text)
                prompt = reused + array("q", tail)
                matches, check = self._drift(req, best, reused, new, tail, prompt, mode)
                return self._count(
                    self._reused(keys, best, reused, tail, matches, check, prompt, fork)
                )
        ids = self.renderer.render_full(req)
        if best is not None and fork is None and array("q", ids[: best.n_tokens]) != best.token_ids:
            fork = ("no_continuation", best.call_id)  # the template cannot continue its turn
        return self._count(
            Rendered(
                prompt_ids=ids,
                reused_tokens=0,
                rendered_tokens=len(ids),
                parent_call=None,
                fresh_render_matches=True,
                keys=keys,
                prompt_array=array("q", ids),
                prompt_json=_ids_json(ids),
                fork_reason=fork[0] if fork else None,
                fork_of=fork[1] if fork else None,
            )
        )

    def _count(self, rendered: Rendered) -> Rendered:
        if rendered.fork_reason is not None:
            with self._lock:
                self.forks[rendered.fork_reason] = self.forks.get(rendered.fork_reason, 0) + 1
        return rendered

    def _recover(
        self, session: str, keys: list[str], best: _Branch | None
    ) -> tuple[_Branch | None, tuple[str, str] | None]:
        """`best`, or a longer call of the session that this cache forgot (evicted, or before a
        restart) read back from the records and kept again. When the index knows such a call
        but its ids cannot be read, `best` and the fork: (reason, that call's id), where the
        reason is `not_recorded` (no record series) or `record_unreadable`."""
        e = self.index.candidate(session, self.renderer.directory, keys, best.n_keys if best else 0)
        if e is None:
            return best, None
        got = self.index.read_ids(e)
        if got is None:
            reason = "not_recorded" if e.shard is None else "record_unreadable"
            return best, (reason, e.call_id)  # a shorter `best` is reused, the rest rendered
        return self._adopt(session, e, keys[: e.n_keys], *got), None

    def _adopt(self, session: str, e: Entry, keys: list[str], ids: array, ids_json: str) -> _Branch:
        """Keep a call read back from the records as if it had never been forgotten."""
        branch = _Branch(
            call_id=e.call_id,
            ids=_Ids(ids, ids_json, keys),
            n_tokens=len(ids),
            n_chars=len(ids_json),
            n_keys=len(keys),
            prompt_len=e.prompt_len,
            ended_with_eos=e.eos,
        )
        with self._lock:
            self.recovered_calls += 1
            self._insert(session, branch, None)
        return branch

    def _drift_mode(self) -> str:
        """How this reuse is checked: "off", "full" (`full`, or the `drift_full_every`-th reuse
        in boundary mode) or "boundary"."""
        if self.drift_check == "off":
            return "off"
        with self._lock:
            self._reuses += 1
            sampled = self.drift_full_every > 0 and self._reuses % self.drift_full_every == 0
        return "full" if self.drift_check == "full" or sampled else "boundary"

    def _drift(
        self, req, best: _Branch, reused: array, new, tail, ids: array, mode: str
    ) -> tuple[bool | None, str | None]:
        """Check the reused ids against a re-render: on the boundary region only (the default,
        O(new tokens)), or in full (`mode` "full") for prompts up to `drift_check_tokens`."""
        if mode == "off":
            return None, None
        if mode == "full" and len(ids) <= self.drift_check_tokens:
            return array("q", self.renderer.render_full(req)) == ids, "full"
        if self.drift_check == "full":
            return None, None
        p = best.prompt_len
        resent = req.messages[best.n_keys - 2]
        matches = self.renderer.boundary_matches(
            reused[max(0, p - 64) : p], reused[p:].tolist(), resent, new, tail
        )
        if matches is None and len(ids) <= self.drift_check_tokens:
            return array("q", self.renderer.render_full(req)) == ids, "full"
        return matches, "boundary" if matches is not None else None

    def remember(
        self,
        session: str,
        call_id: str,
        rendered: Rendered,
        answer: Answer,
        completion_ids: list[int],
        where: tuple[int, int, int] | None = None,
    ) -> None:
        """Keep this call so a later request that extends it reuses its tokens, and index it
        (`where`: its record line, as `CallWriter.write` returned it; None: not recorded) so
        that one still can once this cache has forgotten it."""
        ended = bool(completion_ids) and completion_ids[-1] in self.renderer.eos_ids
        ids = _Ids(
            rendered.prompt_array + array("q", completion_ids),
            _join(rendered.prompt_json, _ids_json(completion_ids)),
            [*rendered.keys, answer.message().key()],
        )
        branch = _Branch(
            call_id=call_id,
            ids=ids,
            n_tokens=len(ids.array),
            n_chars=len(ids.json),
            n_keys=len(ids.keys),
            prompt_len=len(rendered.prompt_array),
            ended_with_eos=ended,
        )
        self.index.add(
            session,
            call_id,
            self.renderer.directory,
            ids.keys,
            branch.prompt_len,
            ended,
            where,
            rendered.parent_call,
        )
        with self._lock:
            self._insert(session, branch, rendered)

    def _insert(self, session: str, branch: _Branch, rendered: Rendered | None) -> None:
        """Add `branch` to the session's calls (the lock is held), sharing ids with the call
        `rendered` reused, then trim the session and the cache to their bounds."""
        ids = branch.ids
        branches = self._sessions.setdefault(session, [])
        self._sessions.move_to_end(session)
        n = branch.n_keys
        parent = None
        for b in branches:
            if not b.superseded and b.n_keys < n and ids.keys[: b.n_keys] == b.keys:
                b.superseded = True
            if rendered is not None and b.call_id == rendered.parent_call:
                parent = b
        self._attach(branch, ids)
        self.nbytes += _BRANCH_BYTES
        if (
            parent is not None
            and rendered is not None
            and rendered.reused_tokens == parent.n_tokens
        ):
            # this call's ids, JSON and keys begin with the parent's: the parent and the
            # calls it extends become prefixes of this call's copy
            shared = parent.ids
            for b in branches:
                if (
                    b.ids is shared
                    and b.n_tokens <= parent.n_tokens
                    and b.n_chars <= parent.n_chars
                    and b.n_keys <= parent.n_keys
                ):
                    self._detach(b)
                    self._attach(b, ids)
        branches.append(branch)
        # over capacity: forget superseded calls first (oldest first), so the tips of every
        # line of conversation (main agent, sub-agents, side calls) stay reusable
        while len(branches) > self.branches_per_session:
            old = next((i for i, b in enumerate(branches) if b.superseded), 0)
            self._drop(branches.pop(old))
        # over budget: forget the coldest sessions, then this session's oldest calls
        while len(self._sessions) > self.max_sessions or (
            self.nbytes > self.max_bytes and len(self._sessions) > 1
        ):
            self._drop_session(next(iter(self._sessions)))
            self.evicted_sessions += 1
        while self.nbytes > self.max_bytes and branches:
            old = next((i for i, b in enumerate(branches) if b.superseded), 0)
            self._drop(branches.pop(old))
        if not branches:
            del self._sessions[session]

    def forget(self, session: str) -> None:
        with self._lock:
            if session in self._sessions:
                self._drop_session(session)
        self.index.forget(session)


class Detokenizer:
    """Turns sampled ids into text deltas without re-decoding the whole completion each step."""

    def __init__(self, tokenizer) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None:
            self._decode = lambda ids: backend.decode(ids, skip_special_tokens=False)
        else:
            self._decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)
        self.ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        if after.endswith("\ufffd"):
            return ""  # an incomplete UTF-8 sequence: wait for the next token
        self._prefix, self._read = self._read, len(self.ids)
        return after[len(before) :]

    def flush(self) -> str:
        """Text still held back at the end (an incomplete UTF-8 sequence is emitted as is)."""
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        self._prefix = self._read = len(self.ids)
        return after[len(before) :]
