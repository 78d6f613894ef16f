"""Inference engines behind the proxy: one token-in/token-out interface.

An engine continues a list of prompt token ids and reports each sampled id with its logprob
under the distribution it was sampled from: ``log_softmax(logits / T)``, restricted to the
top_k tokens, then to the top_p nucleus of what is left, and renormalised (vLLM's order);
0.0 for a greedy token (T = 0: the distribution is a point mass). The settings are recorded
next to them (`records.sampling_record`). Specs:

- ``transformers:DIR``  in-process HF model, batched (see `_transformers.py`)
- ``vllm:URL``          a vLLM OpenAI server; prompt ids to ``/v1/completions``
- ``scripted:FILE``     deterministic answers from a JSONL script (tests, harness conformance)
- ``passthrough:URL``   a real OpenAI/Anthropic-compatible endpoint; text only, not trainable
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path

import attrs
import httpx

from claw_proxy._vllm_routing import (
    MoELayout,
    decode_routed_experts,
    read_layout,
    routed_experts_enabled,
)
from claw_proxy.errors import ConfigError, EngineError, TransportError
from claw_proxy.records import Policy


@attrs.frozen(kw_only=True)
class GenRequest:
    """What an engine is asked: continue `prompt_ids` with these (already bounded) settings."""

    prompt_ids: Sequence[int]  # a list, or the prefix cache's array('q') of the ids
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    forced: bool = False  # --sampling force overrode what the request asked for
    seed: int | None = None
    stop_ids: tuple[int, ...] = ()
    ignore_eos: bool = False  # the request's `ignore_eos`: stop_ids is empty then
    turn: int = 0  # assistant messages already in the conversation (for scripted engines)
    model: str = ""
    tags: dict = attrs.field(factory=dict)  # the session's tags (scripted engines pick by them)
    session: str = ""  # the rollout the call belongs to (replicas keep a session on one engine)
    # `prompt_ids` as JSON without brackets ("1,2,3"), when known: sent as is, not re-encoded.
    # It must hold exactly `prompt_ids`: whoever changes the ids clears it (evolve(..., ""))
    prompt_json: str = attrs.field(default="", repr=False)


class Generation:
    """One running generation: an async stream of (id, logprob) chunks, fed from any thread.

    An engine that serves an MoE policy and knows where it routed each token (``routes``:
    set when the generation is made) puts one ``"routing"`` item before ``"end"``: a numpy
    array (T, L, K) of the expert indices of every token it forwarded, in order: the prompt
    (T_p = len(prompt_ids) rows), then each sampled token it fed back (every one but the last;
    a generation cancelled mid-way may have fed the last one too, so T >= P + C - 1 where C is
    the tokens the call keeps). L = the model's MoE layers in model order (dense layers
    skipped), K = experts per token, each row in the router's order (largest weight first);
    dtype uint8 when the model has <= 255 experts, else int16. `experts` (E) is set with it.
    The proxy stores the first P + C - 1 rows (`routing.RoutingRows`, docs/formats.md,
    Routing store). Engines that do not route (scripted, passthrough, dense) never put it.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self.policy: dict | None = None  # {name, version} that produced the tokens
        self.cancelled = False
        self.finish: str | None = None  # engine's own finish hint (stop / length)
        self.task: asyncio.Future | None = None  # the engine's task, where it runs one
        self.routes = False  # the engine puts a "routing" item before "end"
        self.routing = None  # that item: (T, L, K) expert indices, once it came
        self.experts = 0  # E of `routing`
        self.ended = False  # "end" or "error" was read

    def put(self, kind: str, value=None) -> None:
        """Thread-safe: 'policy' (dict), 'tokens' (list of (id, logprob)), 'routing' ((T, L,
        K) array; set `experts` first), 'end', 'error'."""
        self._loop.call_soon_threadsafe(self._queue.put_nowait, (kind, value))

    def put_nowait(self, kind: str, value=None) -> None:
        self._queue.put_nowait((kind, value))

    def cancel(self) -> None:
        self.cancelled = True

    async def chunks(self):
        """Yield lists of (id, logprob); tokens already waiting are merged into one list."""
        while True:
            kind, value = await self._queue.get()
            if kind == "tokens":
                value = list(value)
                while not self._queue.empty() and self._queue._queue[0][0] == "tokens":  # type: ignore[attr-defined]  # noqa: SLF001
                    value += self._queue.get_nowait()[1]
                yield value
            elif kind == "policy":
                self.policy = value
            elif kind == "routing":
                self.routing = value
            elif kind == "end":
                self.ended = True
                if value:
                    self.finish = value
                return
            elif kind == "error":
                self.ended = True
                raise (
                    value
                    if isinstance(value, EngineError)
                    else EngineError(f"engine failed: {value}")
                )

    async def settle(self) -> None:
        """After the reader stopped early (a stop sequence cancelled the generation): read what
        the engine still puts until its "end" or "error", keeping the routing. Call it under a
        deadline; tokens read here are dropped (the call ended before them)."""
        while not self.ended:
            kind, value = await self._queue.get()
            if kind == "routing":
                self.routing = value
            elif kind in ("end", "error"):
                self.ended = True


class Engine:
    """Base class. Subclasses implement `generate`; `load_policy` where weights can change."""

    spec = ""
    trainable = True
    #: calls whose completion no model sampled are recorded with `teacher` set to this
    teacher: str | None = None
    tokenizer_dir: str | None = None
    max_context: int | None = None  # prompt + completion tokens the model takes, when known

    def __init__(self) -> None:
        self.policy = {"name": "policy", "version": 0}

    def generate(self, req: GenRequest) -> Generation:
        raise NotImplementedError

    async def preflight(self) -> None:
        """Checks worth failing a start for (`claw-proxy serve` runs them before serving)."""
        return None

    async def alive(self) -> bool:
        """Whether the engine still serves (asked after a failed call, to tell a dead replica
        from a bad request). In-process engines live as long as the proxy."""
        return True

    async def load_policy(self, policy: Policy) -> None:
        raise EngineError(f"engine {self.spec} cannot load new weights", status=501)

    #: ranks this engine takes in a weight-transfer group (a vLLM server: one per worker)
    transfer_ranks = 1

    async def receive_policy(self, policy: Policy, rank: int, world_size: int) -> None:
        """Join `policy.transfer`'s group at ranks `rank`.. of `world_size` and serve the
        weights it sends (`_transfer`); a `ReplicaSet` assigns the ranks."""
        raise EngineError(
            f"engine {self.spec} cannot receive weights over a process group", status=501
        )

    async def aclose(self) -> None:
        return None


class ScriptedEngine(Engine):
    """Deterministic answers from a script, still through the tokenizer, parser and recording.

    The script is JSONL, one answer per line: ``{"text": "..."}``, or ``{"tool_calls": [{"name":
    ..., "arguments": {...}}], "text": "..."}`` (text optional) for an answer that calls tools:
    those are rendered with the chat template, so they come out in the policy's own tool-call
    format, exactly as the template writes such a turn into history. A line may also say
    ``"model": GLOB`` (only for requested model names matching it) and ``"tags": {...}`` (only
    for sessions whose tags hold all of these, e.g. ``{"task": "toy-steps-train-0007"}``: one
    expert solution per task, see ``claw-bench expert``). The answer for a request is chosen
    among the lines that apply by the number of assistant turns already in its conversation
    (turn 0 answers the first request of a rollout, turn 1 the request after the first answer,
    ...); past the end of the script, the last answer repeats. Text is tokenized and ends with
    the eos token; each token gets logprob 0.0 (the script is a deterministic policy), and the
    calls are recorded with ``teacher: "scripted"``: their ids were not sampled from a model.
    """

    teacher = "scripted"

    def __init__(
        self,
        path: str,
        encode,
        eos_id: int,
        policy_name: str = "scripted",
        render_answer=None,
    ) -> None:
        super().__init__()
        self.spec = f"scripted:{path}"
        self.policy = {"name": policy_name, "version": 0}
        self._encode = encode
        self._eos = eos_id
        self._render_answer = render_answer  # (text, [(name, arguments)]) -> ids with the eos
        self.lines: list[dict] = []
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"cannot read script {path}: {e.strerror}") from e
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}:{n}: invalid JSON ({e.msg})") from e
            self.lines.append(_script_line(d, f"{path}:{n}"))
        if not self.lines:
            raise ConfigError(f"{path}: the script has no answers")
        self._ids = [self._answer_ids(d, f"{path}:{n}") for n, d in enumerate(self.lines, 1)]

    def _answer_ids(self, d: dict, where: str) -> list[int]:
        if not d.get("tool_calls"):
            return self._encode(d.get("text", "")) + [self._eos]
        if self._render_answer is None:
            raise ConfigError(f"{where}: tool_calls need the chat template (pass --tokenizer)")
        calls = [(c["name"], c["arguments"]) for c in d["tool_calls"]]
        return self._render_answer(d.get("text", ""), calls)

    async def load_policy(self, policy: Policy) -> None:
        """A new version: a JSONL script file replaces the answers; a directory (an HF model the
        script stands in for) keeps them. Either way later calls carry the new version."""
        if Path(policy.path).is_file():
            fresh = ScriptedEngine(
                policy.path, self._encode, self._eos, policy.name, self._render_answer
            )
            self.lines, self._ids = fresh.lines, fresh._ids
        elif not Path(policy.path).is_dir():
            raise EngineError(
                f"policy path {policy.path} is neither a script file nor a directory", status=400
            )
        self.policy = {"name": policy.name, "version": policy.version}

    def _pick(self, req: GenRequest) -> list[int]:
        from fnmatch import fnmatch

        idx = [
            i
            for i, d in enumerate(self.lines)
            if fnmatch(req.model, d.get("model", "*"))
            and all(req.tags.get(k) == v for k, v in d.get("tags", {}).items())
        ]
        if not idx:
            raise EngineError(
                f"the script has no answer for model {req.model!r} and session tags {req.tags}",
                status=500,
            )
        return self._ids[idx[min(req.turn, len(idx) - 1)]]

    def generate(self, req: GenRequest) -> Generation:
        gen = Generation()
        gen.put_nowait("policy", dict(self.policy))
        ids = self._pick(req)[: req.max_tokens]
        for i in ids:
            gen.put_nowait("tokens", [(i, 0.0)])
        gen.put_nowait("end", None)
        return gen


def _script_line(d, where: str) -> dict:
    """A script line, checked: text and/or tool_calls, optional model glob and session tags."""
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: each line must be a JSON object")
    if "text" in d and not isinstance(d["text"], str):
        raise ConfigError(f"{where}: field 'text' must be a string")
    calls = d.get("tool_calls")
    well_formed = isinstance(calls, list) and all(
        isinstance(c, dict)
        and isinstance(c.get("name"), str)
        and c["name"]
        and isinstance(c.get("arguments"), dict)
        for c in calls
    )
    if calls is not None and not well_formed:
        raise ConfigError(
            f"{where}: field 'tool_calls' must be a list of {{\"name\": string, "
            '"arguments": object}}'
        )
    if "text" not in d and not calls:
        raise ConfigError(f"{where}: each line needs a string 'text' or a list 'tool_calls'")
    if "model" in d and not isinstance(d["model"], str):
        raise ConfigError(f"{where}: field 'model' must be a string (a glob)")
    tags = d.get("tags", {})
    if not isinstance(tags, dict) or not all(isinstance(v, str) for v in tags.values()):
        raise ConfigError(f"{where}: field 'tags' must be an object of strings")
    return d


# what vLLM's `--logprobs-mode` must be for its logprobs to be those of the sampled distribution
LOGPROBS_MODE_NEEDED = {
    "force": ("raw_logprobs", "processed_logprobs"),
    "honor": ("processed_logprobs",),
}


class VLLMEngine(Engine):
    """A vLLM OpenAI-compatible server, driven token-in/token-out through `/v1/completions`
    (streamed: each chunk's `token_ids` and `logprobs.token_logprobs` go on as they come).

    Every setting that shapes the sampled distribution is sent explicitly (temperature, top_p,
    top_k, and min_p 0, no penalties), so the model's `generation_config.json` defaults, which
    vLLM applies to settings a request leaves out, never change what is sampled behind the
    record's back. vLLM reports the logprob of a sampled token according to its server-wide
    ``--logprobs-mode``: ``raw_logprobs`` (the default) is the log-softmax of the unscaled,
    untruncated logits, which is the sampled distribution only at temperature 1 with no
    top_p / top_k, so it is right under ``--sampling force``; ``processed_logprobs`` is taken
    after temperature and top_k / top_p (renormalised), right under ``--sampling honor``.
    Before its first request the engine reads the mode from vLLM's ``/server_info`` (a route
    of ``VLLM_SERVER_DEV_MODE=1``, which weight reloads need anyway) and refuses to serve when
    it does not fit `sampling`; under ``honor`` a mode it cannot read is refused too.

    An MoE policy's routing (docs/vllm-moe.md): when ``/server_info`` says vLLM returns routed
    experts (``--enable-return-routed-experts``), every call asks without streaming (vLLM
    puts ``routed_experts`` only on a whole answer), and its (P + C - 1, L, K) expert indices
    go to the generation as its ``"routing"`` before ``"end"``. L, K and E come from the
    policy's ``config.json`` in `tokenizer_dir` (`_vllm_routing.MoELayout`); an answer whose
    routing does not fit them is an engine error (502), never a call recorded with it.
    """

    def __init__(
        self,
        url: str,
        policy_name: str = "policy",
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: float = 600.0,
        reload_method: str = "reload_weights",
        sampling: str = "force",
    ) -> None:
        super().__init__()
        self.url = url.rstrip("/")
        self.spec = f"vllm:{self.url}"
        self.reload_method = reload_method
        self.sampling = sampling
        self.logprobs_mode: str | None = None  # vLLM's --logprobs-mode, once checked
        self._mode_checked = False
        self.moe: MoELayout | None = None  # set once checked: vLLM returns routed experts
        self._moe_warned = False
        self.policy = {"name": policy_name, "version": 0}
        self._transport = transport
        self._client = httpx.AsyncClient(
            base_url=self.url, transport=transport or http_transport(), timeout=timeout
        )
        self._fast = fast_client(self.url, transport, timeout)  # for /v1/completions
        self._model: str | None = None
        self._lora: str | None = None
        self._reload_lock = asyncio.Lock()
        self._idle = asyncio.Event()
        self._idle.set()
        self._in_flight = 0

    async def _served_model(self) -> str:
        if self._model is None:
            try:
                r = await self._client.get("/v1/models")
                r.raise_for_status()
                self._model = r.json()["data"][0]["id"]
            except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
                raise EngineError(f"vLLM at {self.url} did not list its model: {e}") from e
        return self._lora or self._model

    async def _server_info(self, client: httpx.AsyncClient) -> dict | None:
        """vLLM's /server_info (config_format=json), or None when vLLM does not serve it."""
        try:
            r = await client.get("/server_info", params={"config_format": "json"})
        except httpx.HTTPError as e:
            raise EngineError(f"vLLM at {self.url} is not reachable: {e}") from e
        if r.status_code != 200:
            return None
        try:
            info = r.json()
        except ValueError:
            return None
        return info if isinstance(info, dict) else None

    def _check_server(self, info: dict | None) -> None:
        """Check the logprobs mode and decide whether calls record routing (`moe`)."""
        try:
            mode = info["vllm_config"]["model_config"]["logprobs_mode"]  # type: ignore[index]
        except (KeyError, TypeError):
            mode = None
        self._check_mode(mode if isinstance(mode, str) else None)
        try:
            layout = read_layout(self.tokenizer_dir)
        except ConfigError as e:
            raise EngineError(str(e), status=500) from None
        if routed_experts_enabled(info):
            if layout is None:
                raise EngineError(
                    f"vLLM at {self.url} returns routed experts, but the policy directory "
                    f"{self.tokenizer_dir} has no config.json of an MoE model to read its "
                    "layers and experts from: pass --tokenizer the policy's HF directory",
                    status=500,
                )
            self.moe = layout
        elif layout is not None and not self._moe_warned:
            self._moe_warned = True
            logging.getLogger("claw_proxy").warning(
                "vLLM at %s serves an MoE policy (%d experts) without returning routed experts%s: "
                "its calls are recorded without routing (start vLLM with "
                "--enable-return-routed-experts, see docs/vllm-moe.md)",
                self.url,
                layout.experts,
                "" if info is not None else " (or no /server_info: VLLM_SERVER_DEV_MODE=1)",
            )

    def _check_mode(self, mode: str | None) -> None:
        need = LOGPROBS_MODE_NEEDED[self.sampling]
        if mode in need or (mode is None and self.sampling == "force"):
            self.logprobs_mode, self._mode_checked = mode, True
            return
        told = (
            f"it runs with --logprobs-mode {mode}"
            if mode
            else "its logprobs mode cannot be read (no /server_info: start it with "
            "VLLM_SERVER_DEV_MODE=1)"
        )
        raise EngineError(
            f"vLLM at {self.url} cannot serve --sampling {self.sampling}: {told}. The records need "
            "the logprobs of the distribution each token was sampled from; start vLLM with "
            f"--logprobs-mode {need[-1]}"
            + ("" if self.sampling == "force" else ", or run the proxy with --sampling force"),
            status=500,
        )

    async def preflight(self) -> None:
        """Check vLLM's logprobs mode and routing now (an unreachable vLLM is checked at the
        first request)."""
        async with httpx.AsyncClient(
            base_url=self.url, transport=self._transport, timeout=30.0
        ) as client:
            try:
                info = await self._server_info(client)
            except EngineError:
                return
        try:
            self._check_server(info)
        except EngineError as e:
            raise ConfigError(str(e)) from None

    def generate(self, req: GenRequest) -> Generation:
        gen = Generation()
        gen.task = asyncio.ensure_future(self._run(req, gen))
        return gen

    def _content(self, req: GenRequest, model: str, policy: dict, stream: bool) -> bytes:
        """The /v1/completions request body of `req`."""
        body = {
            "model": model,
            "max_tokens": req.max_tokens,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "top_k": req.top_k,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "logprobs": 1,
            # the sampled ids come as the logprobs' tokens ("token_id:N"): vLLM's
            # return_token_ids would also echo the whole prompt back in the first chunk
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "stop_token_ids": list(req.stop_ids),
            "ignore_eos": req.ignore_eos,
            "include_stop_str_in_output": True,
            "stream": stream,
        }
        if req.seed is not None:
            body["seed"] = req.seed
        body["cache_salt"] = cache_salt(policy)
        # the prompt ids go out as the JSON the renderer already holds (no re-encoding;
        # it holds exactly `prompt_ids` by GenRequest's contract: only its ends are checked,
        # as counting its commas would cost a pass over the whole context per call)
        prompt, ids = req.prompt_json, req.prompt_ids
        if not (prompt and ids and _ends_match(prompt, ids)):
            prompt = ",".join(map(str, ids))
        return f'{json.dumps(body)[:-1]},"prompt":[{prompt}]}}'.encode()

    async def _run(self, req: GenRequest, gen: Generation) -> None:
        await self._idle.wait()  # a reload in progress: this request goes out on the new weights
        self._in_flight += 1
        try:
            if not self._mode_checked:
                self._check_server(await self._server_info(self._client))
            model = await self._served_model()
            policy = dict(self.policy)
            moe = self.moe
            gen.routes = moe is not None
            greedy = req.temperature == 0  # a point mass: each token's logprob is 0.0
            gen.put_nowait("policy", policy)
            content = self._content(req, model, policy, stream=moe is None)
            if moe is not None:
                finish = await self._whole(content, gen, greedy, len(req.prompt_ids), moe)
            else:
                r = await post(self._fast, self._client, "/v1/completions", content, _JSON)
                try:
                    if r.status >= 400:
                        raise EngineError(f"vLLM answered {r.status}: {(await r.read())[:300]!r}")
                    finish = await _streamed(r, gen, greedy)
                finally:
                    await r.aclose()  # before the end: closing early makes vLLM abort the request
            gen.put_nowait("end", finish)
        except TransportError as e:
            gen.put_nowait("error", EngineError(f"vLLM request failed: {e}"))
        except EngineError as e:
            gen.put_nowait("error", e)
        except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as e:
            gen.put_nowait("error", EngineError(f"vLLM request failed: {type(e).__name__}: {e}"))
        finally:
            self._in_flight -= 1

    async def _whole(
        self, content: bytes, gen: Generation, greedy: bool, prompt_len: int, moe: MoELayout
    ) -> str | None:
        """Ask for a whole (non-streamed) answer of an MoE policy and pass on its tokens, then
        its routing (checked against `moe` before any token goes on); its finish. vLLM sends
        nothing before the whole answer: a generation cancelled meanwhile drops the request
        (closing the connection makes vLLM abort it) and gets neither."""

        async def fetch() -> bytes:
            r = await post(self._fast, self._client, "/v1/completions", content, _JSON)
            try:
                body = await r.read()
            finally:
                await r.aclose()
            if r.status >= 400:
                raise EngineError(f"vLLM answered {r.status}: {body[:300]!r}")
            return body

        task = asyncio.ensure_future(fetch())
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=0.05)
                if gen.cancelled and not task.done():
                    return None
            out = json.loads(task.result())
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        choices = out.get("choices") if isinstance(out, dict) else None
        if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
            raise EngineError("vLLM answered without exactly one completion choice", status=502)
        choice = choices[0]
        pairs = _pairs(choice, greedy)
        rows = decode_routed_experts(choice.get("routed_experts"), prompt_len, len(pairs), moe)
        if pairs:
            gen.put_nowait("tokens", pairs)
        gen.experts = moe.experts
        gen.put_nowait("routing", rows)
        return choice.get("finish_reason")

    async def load_policy(self, policy: Policy) -> None:
        """Load new weights into the running vLLM.

        An HF directory goes through vLLM's weight-reload routes (the server must run with
        ``VLLM_SERVER_DEV_MODE=1``): ``/pause?mode=wait`` (requests in flight finish on the old
        weights), ``/collective_rpc`` with `reload_method` (vLLM's ``reload_weights``, or a
        worker-extension method that also re-ties tied embeddings), ``/reset_prefix_cache``,
        ``/update_weight_version``, ``/resume``. A LoRA adapter directory (with
        ``adapter_config.json``) is loaded with ``/v1/load_lora_adapter`` instead. Requests
        that arrive meanwhile wait and are sent, and recorded, with the new version. A policy
        with ``transfer`` comes over the learner's process group (`receive_policy`)."""
        if policy.transfer is not None:
            from claw_proxy._transfer import load_single

            await load_single(self, policy)
            return
        async with self._reload_lock:
            self._idle.clear()
            try:
                await self._wait_in_flight()
                if (Path(policy.path) / "adapter_config.json").exists():
                    name = f"{policy.name}-v{policy.version}"
                    await self._admin(
                        "POST",
                        "/v1/load_lora_adapter",
                        json={"lora_name": name, "lora_path": policy.path},
                    )
                    self._lora = name
                else:
                    await self._admin("POST", "/pause", params={"mode": "wait"})
                    try:
                        await self._admin(
                            "POST",
                            "/collective_rpc",
                            json={
                                "method": self.reload_method,
                                "kwargs": {"weights_path": policy.path},
                            },
                        )
                        await self._admin("POST", "/reset_prefix_cache")
                        await self._admin(
                            "POST",
                            "/update_weight_version",
                            json={"new_version": str(policy.version)},
                        )
                    finally:
                        await self._admin("POST", "/resume")
                    self._lora = None
                self.policy = {"name": policy.name, "version": policy.version}
            finally:
                self._idle.set()

    async def receive_policy(self, policy: Policy, rank: int, world_size: int) -> None:
        """Weights over the learner's process group, through the claw worker extension
        (examples/gpu/claw_vllm_worker.py, ``--worker-extension-cls``): ``/pause``, then
        ``/collective_rpc`` ``claw_receive_weights`` (each worker joins at `rank` + its own
        rank, receives the buckets and loads them with ``model.load_weights``),
        ``/reset_prefix_cache``, ``/update_weight_version``, the version handshake (vLLM's
        ``/weight_info`` must report the new version), ``/resume``. Calls that arrive meanwhile
        wait and go out on the new weights."""
        kwargs = {
            "transfer": policy.transfer,
            "version": policy.version,
            "rank": rank,
            "world_size": world_size,
        }
        async with self._reload_lock:
            self._idle.clear()
            try:
                await self._wait_in_flight()
                await self._admin("POST", "/pause", params={"mode": "wait"})
                try:
                    rpc = {"method": "claw_receive_weights", "kwargs": kwargs}
                    await self._admin("POST", "/collective_rpc", json=rpc)
                    await self._admin("POST", "/reset_prefix_cache")
                    new = str(policy.version)
                    await self._admin("POST", "/update_weight_version", json={"new_version": new})
                    await self._check_weight_version(new)
                except BaseException:  # its error, not that of a /resume to a dead server
                    with contextlib.suppress(EngineError):
                        await self._admin("POST", "/resume")
                    raise
                await self._admin("POST", "/resume")
                self._lora = None
                self.policy = {"name": policy.name, "version": policy.version}
            finally:
                self._idle.set()

    async def _check_weight_version(self, want: str) -> None:
        """The handshake: vLLM's ``/weight_info`` reports `want` (a vLLM without the route is
        taken at its word)."""
        try:
            r = await self._client.get("/weight_info")
        except httpx.HTTPError as e:
            raise EngineError(f"vLLM /weight_info failed: {e}") from e
        if r.status_code == 404:
            return
        got = r.json().get("weight_version") if r.status_code == 200 else None
        if str(got) != want:
            raise EngineError(f"vLLM reports weight version {got!r} after the update to {want}")

    # --- sleep mode: the engine frees the GPU while a learner on the same GPU trains ----------

    #: the vLLM sleep level while asleep (`sleep`), None while awake
    sleeping: int | None = None

    async def sleep(self, level: int) -> None:
        """Free this vLLM's GPU memory for a learner on the same GPU (vLLM's sleep mode: the
        server runs with ``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1``, CUDA or ROCm
        only). New calls wait from now until `wake`; those in flight finish first
        (``/sleep?level=N&mode=wait``). Level 1 offloads the weights to CPU memory and frees
        the KV cache; level 2 frees both, so `wake` must bring weights. A sleep that fails
        leaves the engine held (its memory state unknown) unless vLLM says it is awake."""
        if level not in (1, 2):
            raise EngineError(f"vLLM sleep level must be 1 or 2, got {level!r}", status=400)
        async with self._reload_lock:
            if self.sleeping is not None:
                if level > self.sleeping:  # from level 1 to 2: vLLM ignores a second sleep
                    raise EngineError(f"vLLM at {self.url} already sleeps at level 1", status=409)
                return
            self._idle.clear()
            self.sleeping = level
            await self._wait_in_flight()
            try:
                await self._admin("POST", "/sleep", params={"level": level, "mode": "wait"})
            except EngineError as e:
                if await self._awake():  # nothing was freed: serve on
                    with contextlib.suppress(EngineError):
                        await self._admin("POST", "/resume")
                    self.sleeping = None
                    self._idle.set()
                raise EngineError(
                    f"vLLM at {self.url} did not sleep ({e}); it sleeps only when started with "
                    "--enable-sleep-mode, on a GPU",
                    status=e.status,
                ) from None

    async def wake(
        self, policy: Policy | None = None, rank: int | None = None, world_size: int | None = None
    ) -> None:
        """Wake a sleeping vLLM: its weights (level 1: back from CPU memory; level 2: memory
        whose values are lost), then `policy`'s weights when given (`_load_awake`), then the KV
        cache (and anything else asleep); the calls held meanwhile go out on the new weights.
        A level-2 sleep needs `policy`. An engine that does not sleep just loads `policy`. A
        failed wake keeps the engine held (it never serves weights it may not have) and
        raises; a later wake tries again from the start."""
        if self.sleeping is None:
            if policy is not None and rank is not None and world_size is not None:
                await self.receive_policy(policy, rank, world_size)
            elif policy is not None:
                await self.load_policy(policy)
            return
        if policy is None and self.sleeping == 2:
            raise EngineError(
                f"vLLM at {self.url} slept at level 2, which discards the weights: wake it "
                "with a policy to load",
                status=409,
            )
        if policy is not None and policy.transfer is not None and rank is None:
            from claw_proxy._transfer import announce  # a lone engine: the group is rank 0 + it

            world_size, rank = 1 + self.transfer_ranks, 1
            await asyncio.to_thread(announce, policy.transfer, policy.version, world_size)
        async with self._reload_lock:
            try:
                await self._admin("POST", "/wake_up", params={"tags": "weights"})
                if policy is not None:
                    await self._load_awake(policy, rank, world_size)
                await self._admin("POST", "/wake_up", params={"tags": "kv_cache"})
                if not await self._awake():  # a tag this version added: wake everything
                    await self._admin("POST", "/wake_up")
            except EngineError as e:
                raise EngineError(f"vLLM at {self.url} did not wake: {e}", status=e.status) from e
            if policy is not None:
                self.policy = {"name": policy.name, "version": policy.version}
            self.sleeping = None
            self._idle.set()

    async def _load_awake(self, policy: Policy, rank: int | None, world_size: int | None) -> None:
        """Between the weights' wake and the KV cache's: `policy`'s weights over its group
        (``claw_receive_weights`` at `rank`), a LoRA adapter (``/v1/load_lora_adapter``), or a
        directory (`reload_method`); then the prefix cache reset and the version handshake.
        No ``/pause`` or ``/resume``: the sleeping scheduler resumes once all memory is back."""
        if policy.transfer is not None:
            kwargs = {"transfer": policy.transfer, "version": policy.version}
            kwargs.update(rank=rank, world_size=world_size)
            rpc = {"method": "claw_receive_weights", "kwargs": kwargs}
        elif (Path(policy.path) / "adapter_config.json").exists():
            name = f"{policy.name}-v{policy.version}"
            body = {"lora_name": name, "lora_path": policy.path}
            await self._admin("POST", "/v1/load_lora_adapter", json=body)
            self._lora = name
            return
        else:
            kwargs = {"weights_path": policy.path}
            rpc = {"method": self.reload_method, "kwargs": kwargs}
        await self._admin("POST", "/collective_rpc", json=rpc)
        await self._admin("POST", "/reset_prefix_cache")
        new = str(policy.version)
        await self._admin("POST", "/update_weight_version", json={"new_version": new})
        if policy.transfer is not None:
            await self._check_weight_version(new)
        self._lora = None

    async def _awake(self) -> bool:
        """Whether vLLM's ``/is_sleeping`` says it is awake (False when it cannot say)."""
        try:
            r = await self._client.get("/is_sleeping")
            return r.status_code == 200 and r.json().get("is_sleeping") is False
        except (httpx.HTTPError, ValueError, AttributeError):
            return False

    async def alive(self) -> bool:
        """vLLM's ``/health`` answers: not reachable, or a 5xx (its engine died), is dead."""
        try:
            r = await self._client.get("/health", timeout=5.0)
        except httpx.HTTPError:
            return False
        return r.status_code < 500

    async def _admin(self, method: str, path: str, **kw) -> None:
        try:
            r = await self._client.request(method, path, **kw)
        except httpx.HTTPError as e:
            raise EngineError(f"vLLM {path} failed: {e}") from e
        if r.status_code == 404:
            raise EngineError(
                f"vLLM has no {path} route: start it with VLLM_SERVER_DEV_MODE=1 to reload weights",
                status=501,
            )
        if r.status_code >= 400:
            raise EngineError(f"vLLM {path} answered {r.status_code}: {r.text[:300]}")

    async def _wait_in_flight(self) -> None:
        while self._in_flight:
            await asyncio.sleep(0.01)

    async def aclose(self) -> None:
        if self._fast is not None:  # its kept-alive connections, else left for the GC to find open
            await self._fast.aclose()
        await self._client.aclose()


def _pairs(choice: dict, greedy: bool) -> list[tuple[int, float]]:
    """The (id, logprob) pairs of one vLLM completion choice (streamed chunk or whole)."""
    lp = choice.get("logprobs") or {}
    ids = choice.get("token_ids") or _token_ids(lp.get("tokens") or ())
    lps = lp.get("token_logprobs") or []
    if len(ids) != len(lps):
        raise EngineError("vLLM returned token ids and logprobs of different lengths")
    return [(int(i), 0.0 if greedy else _logprob(v)) for i, v in zip(ids, lps, strict=True)]


async def _streamed(r, gen: Generation, greedy: bool) -> str | None:
    """Pass on the tokens of a streamed /v1/completions answer as they come; its finish.

    vLLM sends an event per token; the events that came in one read are parsed in one pass
    (their JSON joined into one array: one `json.loads`, one list of pairs passed on), which is
    what the reader would see anyway (`Generation.chunks` merges waiting tokens). A batch that
    does not parse so is read again event by event, which passes on the tokens before a bad
    event and fails on it as before."""
    finish = None
    rest = b""
    async for chunk in r.iter():
        if gen.cancelled:
            break  # closing the stream makes vLLM abort the request
        data = rest + chunk if rest else chunk
        end = data.rfind(b"\n") + 1
        rest = data[end:]
        if end:
            finish = _events(data[:end], gen, greedy, finish)
    if rest and not gen.cancelled:
        finish = _events(rest, gen, greedy, finish)
    return finish


def _events(block: bytes, gen: Generation, greedy: bool, finish: str | None) -> str | None:
    """Pass on the tokens of the whole lines of an event stream in `block`; the last finish
    reason among them (else `finish`)."""
    payloads = []
    for raw in block.split(b"\n"):
        if raw.startswith(b"data:"):
            payload = raw[5:]
            if payload.strip() != b"[DONE]":
                payloads.append(payload)
    if not payloads:
        return finish
    try:
        events = json.loads(b"[" + b",".join(payloads) + b"]")
        if len(events) != len(payloads):
            raise ValueError("an event is not one JSON value")
        pairs: list[tuple[int, float]] = []
        for event in events:
            for choice in event["choices"]:
                pairs += _pairs(choice, greedy)
                finish = choice.get("finish_reason") or finish
    except (KeyError, IndexError, TypeError, ValueError, EngineError):
        return _each_event(block, gen, greedy, finish)  # raises where that event is
    if pairs:
        gen.put_nowait("tokens", pairs)
    return finish


def _each_event(block: bytes, gen: Generation, greedy: bool, finish: str | None) -> str | None:
    """`_events` one line at a time: the tokens before a bad event go on, then it raises."""
    for raw in block.split(b"\n"):
        line = raw.rstrip(b"\r").decode("utf-8")
        if not line.startswith("data:") or line[5:].strip() == "[DONE]":
            continue
        for choice in json.loads(line[5:])["choices"]:
            pairs = _pairs(choice, greedy)
            if pairs:
                gen.put_nowait("tokens", pairs)
            finish = choice.get("finish_reason") or finish
    return finish


def cache_salt(policy: dict) -> str:
    """vLLM's ``cache_salt`` for calls of one policy version: prefix-cache blocks are keyed by
    it, so blocks computed with one version's weights never serve a call of another (on any
    replica, also for calls that were in flight while new weights loaded)."""
    return f"{policy.get('name', 'policy')}-v{policy.get('version', 0)}"


_JSON = {"content-type": "application/json"}


def http_transport() -> httpx.AsyncHTTPTransport:
    """The connection pool to an engine or upstream: TCP_NODELAY on every connection (without
    it a request's header and body writes meet Nagle and the server's delayed ACK, 40 ms a
    call, on event loops that do not set it themselves) and enough kept-alive connections for
    many concurrent calls, so a busy proxy does not open a connection per request."""
    import socket

    return httpx.AsyncHTTPTransport(
        socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        limits=httpx.Limits(
            max_connections=1024, max_keepalive_connections=256, keepalive_expiry=30.0
        ),
    )


def fast_client(url: str, transport, timeout: float):
    """The kept-alive HTTP/1.1 client to `url` (`claw_proxy._upstream.Upstream`; its answers
    parsed by httptools where `claw-proxy[fast]` is installed, else in Python), or None where httpx
    serves instead: a test transport given, or an HTTP proxy from the environment applies to
    `url`."""
    if transport is not None:
        return None
    from claw_proxy import _upstream

    return _upstream.Upstream(url, timeout=timeout) if _upstream.usable(url) else None


async def post(fast, client: httpx.AsyncClient, path: str, body: bytes, headers: dict):
    """POST over `fast` when there is one, else over httpx's `client`; the answer once its
    status and headers are in, with `status`, `headers`, `read()`, `iter()` and `aclose()`.
    Transport failures (then or while reading) are `EngineError`s."""
    if fast is not None:
        return await fast.request("POST", path, headers, body)
    req = client.build_request("POST", path, content=body, headers=headers)
    try:
        return _HttpxAnswer(await client.send(req, stream=True))
    except httpx.HTTPError as e:
        raise TransportError(f"{type(e).__name__}: {e}") from e


async def sse_lines(chunks):
    """The lines of an event stream given as byte chunks (split on \\n, a \\r before it dropped),
    decoded."""
    rest = b""
    async for chunk in chunks:
        if rest:
            chunk = rest + chunk
        *lines, rest = chunk.split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r").decode("utf-8")
    if rest:
        yield rest.rstrip(b"\r").decode("utf-8")


def _ends_match(prompt_json: str, ids: Sequence[int]) -> bool:
    """Whether "1,2,3"-style `prompt_json` begins with ids[0] and ends with ids[-1]."""
    first, last = str(ids[0]), str(ids[-1])
    return (
        prompt_json.startswith(first)
        and prompt_json[len(first) : len(first) + 1] in ("", ",")
        and prompt_json.endswith(last)
        and prompt_json[-len(last) - 1 : -len(last)] in ("", ",")
    )


def _token_ids(tokens) -> list[int]:
    """Sampled ids from vLLM's logprobs tokens under return_tokens_as_token_ids
    ("token_id:N")."""
    try:
        return [int(t.removeprefix("token_id:")) for t in tokens]
    except (TypeError, ValueError, AttributeError):
        raise EngineError(
            "vLLM returned logprob tokens that are not token ids (expected 'token_id:N'; "
            "return_tokens_as_token_ids not honoured?)"
        ) from None


def _logprob(value) -> float:
    lp = float(value)
    if not math.isfinite(lp):  # vLLM reported a token outside the distribution it sampled from
        raise EngineError(f"vLLM returned the logprob {value!r} for a sampled token")
    return lp


class PassthroughEngine(Engine):
    """A real OpenAI/Anthropic-compatible endpoint: requests are forwarded as they came.

    Calls are recorded with the request and the answer text only (no ids), `trainable: false`:
    for evaluation and SFT data. The upstream key comes from `api_key` (the client's session
    token is never forwarded).
    """

    trainable = False

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: float = 600.0,
    ) -> None:
        super().__init__()
        self.url = url.rstrip("/")
        self.spec = f"passthrough:{self.url}"
        self.policy = {"name": "passthrough", "version": 0}
        self.api_key = api_key
        self.fast = fast_client(self.url, transport, timeout)
        self.client = httpx.AsyncClient(
            base_url=self.url, transport=transport or http_transport(), timeout=timeout
        )

    async def open(self, path: str, body: bytes, headers: dict):
        """POST `body` to `path`; the answer once its status and headers are in, with
        `status`, `headers`, `read()`, `iter()` (the body's bytes as they come) and `aclose()`.
        An upstream that cannot be reached is an `EngineError`."""
        try:
            return await post(self.fast, self.client, path, body, headers)
        except EngineError as e:
            raise EngineError(f"upstream {self.url} failed: {e}") from e

    def headers(self, api: str, incoming) -> dict:
        h = {"content-type": "application/json"}
        if api == "anthropic.messages":
            h["anthropic-version"] = incoming.get("anthropic-version", "2023-06-01")
            if incoming.get("anthropic-beta"):
                h["anthropic-beta"] = incoming["anthropic-beta"]
            if self.api_key:
                h["x-api-key"] = self.api_key
        elif self.api_key:
            h["authorization"] = f"Bearer {self.api_key}"
        return h

    async def aclose(self) -> None:
        if self.fast is not None:
            await self.fast.aclose()
        await self.client.aclose()


class _HttpxAnswer:
    """An httpx streamed response behind the same few names as `_upstream.Response`."""

    def __init__(self, r: httpx.Response) -> None:
        self._r = r
        self.status = r.status_code
        self.headers = r.headers

    async def read(self) -> bytes:
        try:
            return await self._r.aread()
        except httpx.HTTPError as e:
            raise TransportError(f"{type(e).__name__}: {e}") from e

    async def iter(self):
        try:
            async for chunk in self._r.aiter_bytes():  # content-encoding undone
                yield chunk
        except httpx.HTTPError as e:
            raise TransportError(f"{type(e).__name__}: {e}") from e

    async def aclose(self) -> None:
        await self._r.aclose()
