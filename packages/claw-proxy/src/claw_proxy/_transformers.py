"""The in-process engine (`transformers:DIR`): a worker thread that batches concurrent requests.

The worker takes the first waiting request, collects more for `batch_wait` seconds (up to
`max_batch`), left-pads their prompts and decodes them step by step together with a KV cache,
each row with its own temperature / top-p / top-k / seed and its own stop. Every sampled id is
pushed to its request as soon as it is sampled (real streaming) with its logprob under the
distribution it was drawn from (`sampling_logprobs`: logits / T, top_k, then top_p,
renormalised; 0.0 for a greedy token), so the record holds the policy that acted, whatever
settings the call used. A token drawn under top_k / top_p also has its kept set's size less
itself (`kept_size`), on the generation's ``kept`` list (`KeptGeneration`) before the token is
put: the call's ``completion_kept``, so the learner uses the engine's set, not one it decides
again from logits a round-off away. Between steps, finished rows leave the batch and requests that arrived join
it (continuous batching: their prompts are prefilled and their KV caches left-padded into the
running one), as long as the weights have not changed since the batch started.

`load_policy` loads new weights beside the old ones and swaps them between batches: a batch
in flight finishes on the weights it started with and reports that version. A LoRA adapter
directory (a `claw-rl --lora-rank` policy) is merged into the model the engine started with
(needs peft: the `lora` extra).

A policy with ``transfer`` (its weights come over a process group, `_transfer`) and the
same-process shortcut `load_state` (a learner in this process hands over {name: tensor}) update
the weights in place between batches: new batches wait (a running batch admits no more rows),
the batch in flight finishes on the old weights, then the tensors are copied in bucket by bucket
(peak extra memory: one bucket) and the version changes. A LoRA transfer (``lora_scaling``)
carries only the adapter: each targeted weight becomes base + scaling * B @ A, on the base
weights the engine serves (read once from its base directory). A transfer that breaks half-way
leaves weights of no version: the engine then refuses calls (and `alive` says so, so a replica
set marks it down) until a policy loads whole.

An MoE policy (decoder layers whose ``mlp.gate`` is a top-k router returning (logits, scores,
indices), as transformers' Qwen3-MoE) gets forward hooks on its routers (`_Routers`): each
forward's expert indices are kept per request, the prompt's rows from the prefill (left padding
dropped) and one row per token fed back, and put as the generation's ``"routing"`` (T, L, K)
before its end (`Generation`). A dense model gets no hooks and runs the same code as before.

The worker runs its torch ops on `threads` intra-op threads (default 1), leaving the process
default to the rest of the process (a learner in the same process keeps its threads). A decode
step of a small model is many tiny ops that a second thread does not speed up, and an OpenMP
team on a busy machine stalls at every op whose second thread is not scheduled: measured on 2
cores at load 8 (the tiny policy, 16 rows), 11-12 ms per decode step with one thread, 80-190 ms
with two.
"""

from __future__ import annotations

import asyncio
import json
import queue
import re
import threading
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from claw_proxy import _transfer
from claw_proxy.engines import Engine, Generation, GenRequest
from claw_proxy.errors import ConfigError, EngineError
from claw_proxy.records import Policy


def _load(directory: str, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=getattr(torch, dtype))
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot load a model from {directory}: {e}") from e
    model.eval()
    return model


def _load_adapter(base_dir: str, adapter_dir: str, dtype: str):
    """The engine's base model with a PEFT LoRA adapter directory merged in (what vLLM serves
    as base + adapter): a policy of a `claw-rl --lora-rank` run."""
    import warnings

    try:
        from peft import PeftModel
    except ImportError as e:
        raise ConfigError(
            f"{adapter_dir} is a LoRA adapter directory: the transformers engine loads it with "
            f"peft ({e}); pip install 'claw-proxy[lora]'"
        ) from e
    base = _load(base_dir, dtype)
    try:
        with warnings.catch_warnings():  # peft asks transformers' deprecated checkpointing flag
            warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)
            model = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise ConfigError(f"cannot load the LoRA adapter {adapter_dir} on {base_dir}: {e}") from e
    model.eval()
    return model


def _adapter_base(adapter_dir: str) -> str:
    """The base model directory a PEFT adapter directory names (``base_model_name_or_path``)."""
    path = Path(adapter_dir) / "adapter_config.json"
    try:
        base = json.loads(path.read_text()).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError) as e:
        raise ConfigError(f"{path}: not a readable PEFT adapter config ({e})") from e
    if not isinstance(base, str) or not (Path(base) / "config.json").is_file():
        raise ConfigError(
            f"{path}: base_model_name_or_path = {base!r} is not a model directory here; "
            "serve the base model and load the adapter as a policy instead"
        )
    return base


def _cache_arg(model) -> str:
    """The KV-cache keyword of this transformers version (`cache` from 5.x, `past_key_values` before)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _cache_of(out):
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def sampling_logprobs(logits, temperature: float, top_p: float = 1.0, top_k: int = 0):
    """Log-probabilities of the distribution a token is sampled from, for one row of logits.

    ``log_softmax(logits / temperature)`` over the kept set, -inf outside it: the `top_k`
    largest logits (ties at the k-th kept; 0 = off), then the smallest set of those, largest
    first, whose probability (at this temperature, renormalised after top_k) reaches `top_p`,
    i.e. the tokens whose larger-ranked mass is still below `top_p`. This is vLLM's order and
    rule. temperature > 0 (greedy sampling has no distribution to take logprobs from).
    logits: (V,) float -> (V,) float
    """
    import torch

    scaled = logits.float() / temperature
    if top_k and 0 < top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1.0:
        sp, si = torch.sort(torch.softmax(scaled, dim=-1), descending=True)
        above = torch.cumsum(sp, dim=-1) - sp  # mass ranked strictly above each token
        drop = torch.zeros_like(scaled, dtype=torch.bool).scatter_(0, si, above >= top_p)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return torch.log_softmax(scaled, dim=-1)


def truncates(temperature: float, top_p: float, top_k: int, vocab: int) -> bool:
    """Whether a token sampled with these settings is drawn from a truncated kept set (top_k
    below the vocabulary, or top_p < 1; greedy tokens never are)."""
    return temperature > 0 and (top_p < 1.0 or 0 < top_k < vocab)


def kept_size(logp) -> int:
    """The kept set's size less the sampled token, from a row of `sampling_logprobs`: the
    number of finite logprobs less one (the sampled token is always in the set)."""
    import torch

    return int(torch.isfinite(logp).sum()) - 1


class KeptGeneration(Generation):
    """The in-process engine's generation: also the kept-set size of each sampled token
    (``kept``, in token order; -1 = untruncated), appended before the token is put, so every
    token a reader has seen has its entry. Written by the worker thread, read by the proxy
    after the tokens (list appends are atomic)."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[int] = []


class _Job:
    __slots__ = ("req", "gen", "generator", "routing")

    def __init__(self, req: GenRequest, gen: KeptGeneration) -> None:
        self.req, self.gen = req, gen
        self.generator: Any = None  # a torch.Generator, made on the first sampled token
        self.routing: list = []  # (n, L, K) arrays of an MoE policy's forwarded tokens


class _Routers:
    """Forward hooks on an MoE model's top-k routers, in model order: after each forward,
    `take` gives the expert indices it routed every input position to."""

    def __init__(self, routers: list) -> None:
        import torch

        self.experts = int(routers[0].num_experts)
        self.k = int(routers[0].top_k)
        self.dtype = torch.uint8 if self.experts <= 255 else torch.int16
        self._got: list = []
        self.handles = [r.register_forward_hook(self._hook) for r in routers]

    @classmethod
    def of(cls, model) -> _Routers | None:
        """Hooks on `model`'s routers; None for a dense model (nothing hooked)."""
        layers = getattr(getattr(model, "model", None), "layers", None) or ()
        routers = [
            gate
            for layer in layers
            if (gate := getattr(getattr(layer, "mlp", None), "gate", None)) is not None
            and hasattr(gate, "top_k")
            and hasattr(gate, "num_experts")
        ]
        return cls(routers) if routers else None

    def _hook(self, module, args, output) -> None:
        self._got.append(output[2])  # (logits, scores, indices): indices (B*S, K)

    def take(self, B: int, S: int):
        """The last forward's expert indices as a numpy array (B, S, L, K)."""
        import torch

        got, self._got = self._got, []
        if len(got) != len(self.handles):
            raise EngineError(f"{len(got)} MoE routers ran, expected {len(self.handles)}")
        idx = torch.stack(got, dim=1).to(self.dtype)  # (B*S, L, K)
        return idx.view(B, S, len(got), self.k).cpu().numpy()


class TransformersEngine(Engine):
    def __init__(
        self,
        directory: str,
        policy_name: str = "policy",
        version: int = 0,
        max_batch: int = 16,
        batch_wait: float = 0.005,
        dtype: str = "float32",
        threads: int | None = 1,
    ) -> None:
        super().__init__()
        try:
            import torch  # noqa: F401
        except ImportError as e:  # pragma: no cover - depends on the install
            raise ConfigError(
                "the transformers engine needs torch: pip install 'claw-proxy[transformers]'"
            ) from e
        self.spec = f"transformers:{directory}"
        adapter = (Path(directory) / "adapter_config.json").is_file()
        # what a LoRA adapter policy is served on: started on an adapter, the base it names
        self.base_dir = _adapter_base(directory) if adapter else directory
        self.tokenizer_dir = self.base_dir  # an adapter keeps its base's vocabulary
        self.dtype = dtype
        self.max_batch = max_batch
        self.batch_wait = batch_wait
        self.policy = {"name": policy_name, "version": version}
        model = _load_adapter(self.base_dir, directory, dtype) if adapter else None
        self._current = (model or _load(directory, dtype), dict(self.policy))
        # each model's router hooks (None: dense); a model loaded later gets its own
        self._routers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._routers[self._current[0]] = _Routers.of(self._current[0])
        self.routes = self._routers[self._current[0]] is not None
        self.pad_id = self._current[0].config.pad_token_id or 0
        self.max_context = getattr(self._current[0].config, "max_position_embeddings", None)
        self._jobs: queue.Queue = queue.Queue()
        self._weights = threading.Lock()  # held by a running batch, and by an in-place update
        self._pausing = False  # an in-place update waits: running batches admit no new rows
        self._broken: str | None = None  # an in-place update broke half-way: no version served
        self._pristine: dict | None = None  # the base weights LoRA transfers merge onto
        self.batches = 0
        self.batched_rows = 0
        self.threads = threads  # intra-op threads of the worker (None: the process default)
        self.worker_threads = 0  # what the worker runs on, once started
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._worker, args=(started,), name="claw-proxy-engine", daemon=True
        )
        self._thread.start()
        started.wait()  # the process default is back before anyone else starts torch work

    def generate(self, req: GenRequest) -> Generation:
        gen = KeptGeneration()
        gen.routes = self.routes
        if self._broken is not None:
            gen.put_nowait("error", EngineError(self._broken, status=503))
            return gen
        self._jobs.put(_Job(req, gen))
        return gen

    async def alive(self) -> bool:
        return self._broken is None

    async def load_policy(self, policy: Policy) -> None:
        """New weights: an HF directory, or a LoRA adapter directory (``adapter_config.json``)
        on the model this engine started with, merged; with ``transfer``, over the group."""
        if policy.transfer is not None:
            await _transfer.load_single(self, policy)
            return
        if (Path(policy.path) / "adapter_config.json").is_file():
            model = await asyncio.to_thread(_load_adapter, self.base_dir, policy.path, self.dtype)
        else:
            model = await asyncio.to_thread(_load, policy.path, self.dtype)
        new = {"name": policy.name, "version": policy.version}
        self._routers[model] = _Routers.of(model)
        self.routes = self._routers[model] is not None
        self._current = (model, new)  # atomic swap: the next batch uses it
        self.policy = new
        self._broken = None

    async def receive_policy(self, policy: Policy, rank: int, world_size: int) -> None:
        """Join `policy.transfer`'s group as `rank` and take its buckets in place (see the
        module docstring)."""
        t = policy.transfer
        assert t is not None

        group = await asyncio.to_thread(_transfer.join, t, policy.version, rank, world_size)
        buckets = _transfer.receive(t, group)
        await asyncio.to_thread(self._apply, policy, buckets, t.get("lora_scaling"))

    def load_state(
        self, policy: Policy, tensors: Mapping[str, Any], lora_scaling: float | None = None
    ) -> None:
        """The same-process shortcut: serve `policy` with these weights ({HF name: tensor},
        as a learner in this process holds them; with `lora_scaling`, LoRA adapter tensors
        under PEFT's names), copied in place between batches. Blocks until they serve."""
        self._apply(policy, [list(tensors.items())], lora_scaling)

    def _apply(self, policy: Policy, buckets: Iterable[list], lora_scaling: float | None) -> None:
        """Copy the buckets' tensors into the served model between batches; then the version."""
        import torch

        self._pausing = True
        try:
            with self._weights, torch.no_grad():
                model = self._current[0]
                # checkpoint names too (per-expert MoE weights: views into the fused ones)
                own = (
                    model.state_dict(keep_vars=True)
                    if lora_scaling is not None
                    else _transfer.checkpoint_views(model)
                )
                try:
                    if lora_scaling is not None:
                        lora = [p for bucket in buckets for p in bucket]
                        _merge_lora(own, self._base_weights(), lora, float(lora_scaling))
                    else:
                        for bucket in buckets:
                            _copy_in(own, bucket)
                except BaseException as e:
                    self._broken = (
                        f"the update to v{policy.version} broke half-way ({type(e).__name__}: "
                        f"{e}); the engine serves again once a policy loads whole"
                    )
                    raise EngineError(self._broken, status=502) from e
                new = {"name": policy.name, "version": policy.version}
                self._current = (model, new)
                self.policy = new
                self._broken = None
        finally:
            self._pausing = False

    def _base_weights(self) -> dict:
        """The base model's weights (read once from its directory): what LoRA merges onto."""
        if self._pristine is None:
            self._pristine = _load(self.base_dir, self.dtype).state_dict()
        return self._pristine

    async def aclose(self) -> None:
        self._jobs.put(None)
        await asyncio.to_thread(self._thread.join, 10)

    # --- worker thread -----------------------------------------------------------------

    def _worker(self, started: threading.Event) -> None:
        import time

        import torch

        if self.threads is not None:
            _use_threads(self.threads)
        self.worker_threads = torch.get_num_threads()
        started.set()
        while True:
            job = self._jobs.get()
            if job is None:
                return
            batch = [job]
            deadline = time.monotonic() + self.batch_wait
            while len(batch) < self.max_batch:
                left = deadline - time.monotonic()
                try:
                    nxt = (
                        self._jobs.get(timeout=max(left, 0))
                        if left > 0
                        else self._jobs.get_nowait()
                    )
                except queue.Empty:
                    break
                if nxt is None:
                    self._jobs.put(None)
                    break
                batch.append(nxt)
            batch = [j for j in batch if not j.gen.cancelled]
            if not batch:
                continue
            with self._weights:  # an in-place update waits for the batch, and a batch for it
                self._batch(batch)
            self.batches += 1
            self.batched_rows += len(batch)

    def _batch(self, batch: list[_Job]) -> None:
        if self._broken is not None:
            for j in batch:
                j.gen.put("error", EngineError(self._broken, status=503))
            return
        model, policy = self._current
        for j in batch:
            j.gen.put("policy", dict(policy))
        try:
            self._run(model, batch)
        except Exception as e:  # the engine failed: every request of the batch gets a 5xx
            for j in batch:
                j.gen.put(
                    "error", EngineError(f"transformers engine failed: {type(e).__name__}: {e}")
                )

    def _sample(self, logits, job: _Job) -> tuple[int, float, int]:
        """(token, its logprob under the distribution it was drawn from, its kept set's size
        less itself: -1 when untruncated)."""
        import torch

        r = job.req
        if r.temperature == 0:
            return int(torch.argmax(logits)), 0.0, -1
        logp = sampling_logprobs(logits, r.temperature, r.top_p, r.top_k)
        kept = kept_size(logp) if truncates(r.temperature, r.top_p, r.top_k, logp.shape[-1]) else -1
        if job.generator is None:
            job.generator = torch.Generator()
            if r.seed is not None:
                job.generator.manual_seed(r.seed)
            else:
                job.generator.seed()
        tok = int(torch.multinomial(logp.exp(), 1, generator=job.generator))
        return tok, float(logp[tok]), kept

    def _prefill(self, model, jobs: list[_Job], routers: _Routers | None = None):
        """Left-padded forward pass over new prompts: (cache, mask, last positions, logits).
        With `routers`, each job's routing starts with its prompt's rows (padding dropped)."""
        import torch

        B = len(jobs)
        L = max(len(j.req.prompt_ids) for j in jobs)
        ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        mask = torch.zeros((B, L), dtype=torch.long)
        for i, j in enumerate(jobs):
            p = j.req.prompt_ids
            ids[i, L - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, L - len(p) :] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
        if routers is not None:
            got = routers.take(B, L)
            for i, j in enumerate(jobs):
                j.routing = [got[i, L - len(j.req.prompt_ids) :]]
        return _cache_of(out), mask, pos[:, -1:], out.logits[:, -1, :].float()

    @staticmethod
    def _end(job: _Job, reason: str | None, routers: _Routers | None) -> None:
        """End a job's generation; an MoE policy's routing goes first."""
        if routers is not None and job.routing:
            import numpy as np

            job.gen.experts = routers.experts
            job.gen.put("routing", np.concatenate(job.routing))
        job.gen.put("end", reason)

    def _admit(self, model, room: int) -> list[_Job]:
        """Requests waiting now that can join the running batch (same weights, room left)."""
        new: list[_Job] = []
        while len(new) < room and self._current[0] is model and not self._pausing:
            try:
                j = self._jobs.get_nowait()
            except queue.Empty:
                break
            if j is None:
                self._jobs.put(None)
                break
            if not j.gen.cancelled:
                new.append(j)
        return new

    def _run(self, model, batch: list[_Job]) -> None:
        """Decode `batch` step by step. Between steps, finished rows leave the batch and waiting
        requests join it (continuous batching), when the KV cache's layout allows it. Jobs
        that join are appended to `batch`."""
        import torch

        rows = list(batch)
        policy = dict(self._current[1]) if self._current[0] is model else None
        routers = self._routers.get(model)
        with torch.inference_mode():
            past, mask, pos, logits = self._prefill(model, rows, routers)
            counts = [0] * len(rows)
            growable = _layers(past) is not None
            while True:
                nxt, keep = [], []
                for i, j in enumerate(rows):
                    if j.gen.cancelled:
                        self._end(j, None, routers)
                        continue
                    tok, lp, kept = self._sample(logits[i], j)
                    j.gen.kept.append(kept)  # before the token: a reader sees both
                    j.gen.put("tokens", [(tok, lp)])
                    counts[i] += 1
                    if tok in j.req.stop_ids or counts[i] >= j.req.max_tokens:
                        self._end(j, "stop" if tok in j.req.stop_ids else "length", routers)
                        continue
                    nxt.append(tok)
                    keep.append(i)
                new = self._admit(model, self.max_batch - len(keep)) if growable and policy else []
                if not keep and not new:
                    return
                if keep:
                    if len(keep) < len(rows):
                        idx = torch.tensor(keep, dtype=torch.long)
                        _select(past, idx)
                        mask, pos = mask[idx], pos[idx]
                        rows, counts = [rows[i] for i in keep], [counts[i] for i in keep]
                    mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=torch.long)], dim=-1)
                    pos = pos + 1
                    out = model(
                        input_ids=torch.tensor(nxt, dtype=torch.long)[:, None],
                        attention_mask=mask,
                        position_ids=pos,
                        use_cache=True,
                        **{_cache_arg(model): past},
                    )
                    past = _cache_of(out)
                    logits = out.logits[:, -1, :].float()
                    mask, past = _trim(mask, past)
                    if routers is not None:
                        got = routers.take(len(rows), 1)
                        for i, j in enumerate(rows):
                            j.routing.append(got[i])
                if new:
                    assert policy is not None  # jobs are admitted only under a policy
                    for j in new:
                        j.gen.put("policy", dict(policy))
                    batch.extend(new)
                    past2, mask2, pos2, logits2 = self._prefill(model, new, routers)
                    if keep:
                        past, mask = _merge(past, mask, past2, mask2)
                        pos, logits = torch.cat([pos, pos2]), torch.cat([logits, logits2])
                        rows, counts = rows + new, counts + [0] * len(new)
                    else:
                        past, mask, pos, logits = past2, mask2, pos2, logits2
                        rows, counts = new, [0] * len(new)


def _copy_in(own: dict, pairs: list) -> None:
    """Copy received (HF name, tensor) pairs into the model's tensors (`state_dict`'s names)."""
    for name, t in pairs:
        dst = own.get(name)
        if dst is None:
            raise EngineError(f"the transfer sent {name!r}, a weight this model does not have")
        if tuple(dst.shape) != tuple(t.shape):
            raise EngineError(
                f"the transfer sent {name!r} of shape {tuple(t.shape)}, the model's is "
                f"{tuple(dst.shape)}"
            )
        dst.data.copy_(t)


_LORA = re.compile(r"^(?:base_model\.model\.)?(.+)\.lora_([AB])(?:\.[^.]+)?\.weight$")


def _merge_lora(own: dict, base: dict, pairs: list, scaling: float) -> None:
    """Each targeted weight W = base W + scaling * B @ A (PEFT's merge), from adapter tensors
    under PEFT's saved names (``base_model.model.<module>.lora_A.weight``)."""
    ab: dict[str, dict[str, Any]] = {}
    for name, t in pairs:
        m = _LORA.match(name)
        if m is None:
            raise EngineError(f"the LoRA transfer sent {name!r}, not a lora_A / lora_B weight")
        ab.setdefault(m.group(1) + ".weight", {})[m.group(2)] = t
    for key, d in ab.items():
        if key not in own or key not in base or set(d) != {"A", "B"}:
            raise EngineError(f"the LoRA transfer has no A and B for a model weight {key!r}")
        delta = scaling * (d["B"].float() @ d["A"].float())
        own[key].data.copy_(base[key].float() + delta)


def _use_threads(n: int) -> None:
    """Run the calling thread's torch ops on `n` intra-op threads, and leave the process default
    (what threads that start torch work later get) as it was. `torch.set_num_threads` sets both
    the caller's OpenMP/MKL team size and that default, so a short-lived thread puts the default
    back; the caller's own team keeps `n`. Where the thread pool is one for the whole process
    (not OpenMP), this has no lasting effect."""
    import torch

    before = torch.get_num_threads()  # the caller's first torch call: it starts with the default
    if before == n:
        return
    torch.set_num_threads(n)
    restore = threading.Thread(target=torch.set_num_threads, args=(before,))
    restore.start()
    restore.join()


def _layers(cache):
    """The (keys, values) holders of a KV cache, or None for a layout this engine cannot edit."""
    layers = getattr(cache, "layers", None)
    if layers and all(hasattr(layer, "keys") and hasattr(layer, "values") for layer in layers):
        return layers
    return None


def _select(cache, idx) -> None:
    for layer in _layers(cache) or ():
        layer.keys, layer.values = layer.keys[idx], layer.values[idx]
    if _layers(cache) is None:
        cache.batch_select_indices(idx)


def _pad_left(t, n: int):
    import torch

    if n == 0:
        return t
    shape = list(t.shape)
    shape[-2] = n
    return torch.cat([t.new_zeros(shape), t], dim=-2)


def _merge(cache, mask, cache2, mask2):
    """Stack two batches' caches and masks, left-padding the shorter in time."""
    import torch

    T1, T2 = mask.shape[1], mask2.shape[1]
    T = max(T1, T2)
    for a, b in zip(_layers(cache), _layers(cache2), strict=True):
        a.keys = torch.cat([_pad_left(a.keys, T - T1), _pad_left(b.keys, T - T2)], dim=0)
        a.values = torch.cat([_pad_left(a.values, T - T1), _pad_left(b.values, T - T2)], dim=0)
    pad = lambda m, n: torch.cat([m.new_zeros((m.shape[0], n)), m], dim=1)  # noqa: E731
    return cache, torch.cat([pad(mask, T - T1), pad(mask2, T - T2)], dim=0)


def _trim(mask, cache):
    """Drop time columns that are padding for every row (left over from rows that left)."""
    lead = int((mask.cumsum(-1) == 0).sum(-1).min())
    layers = _layers(cache)
    if lead == 0 or layers is None:
        return mask, cache
    for layer in layers:
        layer.keys, layer.values = layer.keys[..., lead:, :], layer.values[..., lead:, :]
    return mask[:, lead:], cache
