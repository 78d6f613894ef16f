"""vLLM for the tests: start its OpenAI server from .venvs/vllm, reload weights over HTTP, and
compute reference logprobs with transformers.

Full-weight reload into a running vLLM (0.32, `VLLM_SERVER_DEV_MODE=1` enables the routes)::

    POST /pause?mode=wait                         finish in-flight requests, hold new ones
    POST /collective_rpc  {"method": "reload_weights", "kwargs": {"weights_path": DIR}}
                                                  every worker reloads DIR's safetensors in place
                                                  (tied embeddings: use "claw_reload_weights",
                                                  see claw_vllm_worker.py)
    POST /reset_prefix_cache                      KV blocks computed with the old weights
    POST /update_weight_version  {"new_version": "3"}
    POST /resume
    GET  /weight_info  ->  {"weight_version": "3"}

DIR is an HF model directory of the same architecture (what claw-rl writes as a policy).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import httpx
from _servers import ROOT, TINY, free_port, stop, wait_http

VLLM_PY = Path(os.environ.get("CLAW_VENVS", ROOT / ".venvs")) / "vllm" / "bin" / "python"
MAX_MODEL_LEN = 40960  # a Claude Code prompt is ~25k tokens with the tiny tokenizer
GPU_RECIPE = ROOT / "examples" / "gpu"  # launch.sh, claw_vllm_worker.py, vllm-policy.args


def policy_flags() -> list[str]:
    """The policy server's vLLM flags as examples/gpu/launch.sh starts it (vllm-policy.args: the
    worker extension with claw_reload_weights, prefix caching, processed logprobs)."""
    lines = (GPU_RECIPE / "vllm-policy.args").read_text().splitlines()
    return [x.strip() for x in lines if x.strip() and not x.startswith("#")]


def vllm_missing() -> str | None:
    """Why vLLM cannot run here, or None."""
    if not VLLM_PY.exists():
        return f"vLLM is not installed ({VLLM_PY} missing): run ./dev/install-vllm"
    r = subprocess.run([str(VLLM_PY), "-c", "import vllm"], capture_output=True, text=True)
    if r.returncode != 0:
        return (
            f"vLLM does not import in {VLLM_PY.parent.parent}: {r.stderr.strip().splitlines()[-1:]}"
        )
    return None


@contextlib.contextmanager
def vllm_server(workdir: Path, model: Path = TINY, name: str = "tiny", extra: tuple[str, ...] = ()):
    """Run vLLM's OpenAI server (float32, eager, 1 GiB KV cache, dev routes) with launch.sh's
    policy flags, then `extra` (e.g. --no-enable-prefix-caching); yields (url, ready_s)."""
    port = free_port()
    log = workdir / "vllm.log"
    argv = [
        str(VLLM_PY),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        name,
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--enforce-eager",
        "--dtype",
        "float32",
        "--kv-cache-memory-bytes",
        str(1 << 30),
        "--seed",
        "0",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        # launch.sh's: the worker extension, prefix caching, logprobs after temperature / top_k /
        # top_p (what claw-proxy --sampling honor needs; at T 1 with no truncation, what
        # --sampling force samples with, they equal the raw ones)
        *policy_flags(),
        # CPU only: whole prompts, no chunked prefill. A partly prefilled request's sampled token
        # is discarded by rewinding its generator (gpu_model_runner._bookkeeping_sync), and a
        # CPU torch.Generator has no offset: a seeded call (claw-proxy --seed, the loop's
        # default) longer than one chunk (a Claude Code prompt) kills the engine.
        "--no-enable-chunked-prefill",
        "--max-num-batched-tokens",
        str(MAX_MODEL_LEN),
        *extra,
    ]
    here = str(GPU_RECIPE)  # claw_vllm_worker.py
    env = dict(
        os.environ,
        VLLM_SERVER_DEV_MODE="1",
        PYTHONPATH=os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p),
    )
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=workdir)
    try:
        ready = wait_http(f"http://127.0.0.1:{port}/health", proc, 600, log)
        yield f"http://127.0.0.1:{port}", ready
    finally:
        stop(proc)


def reload_weights(
    url: str,
    weights_dir: str | Path,
    version: int,
    timeout: float = 300,
    method: str = "claw_reload_weights",
) -> dict:
    """Load an HF directory's weights into a running vLLM (see the module docstring); timings.

    `method` is the worker method /collective_rpc calls: vLLM's own `reload_weights`, or
    `claw_reload_weights` from claw_vllm_worker.py, which also re-ties tied embeddings.
    """
    t: dict = {}
    with httpx.Client(base_url=url, timeout=timeout) as c:

        def step(name: str, method: str, path: str, **kw):
            t0 = time.monotonic()
            r = c.request(method, path, **kw)
            if r.status_code >= 400:
                raise RuntimeError(f"vLLM {method} {path} answered {r.status_code}: {r.text[:500]}")
            t[name] = round(time.monotonic() - t0, 3)
            return r

        step("pause_s", "POST", "/pause", params={"mode": "wait"})
        try:
            r = step(
                "reload_s",
                "POST",
                "/collective_rpc",
                json={"method": method, "kwargs": {"weights_path": str(weights_dir)}},
            )
            t["workers"] = r.json().get("results") if r.content else None
            step("reset_prefix_cache_s", "POST", "/reset_prefix_cache")
            step("version_s", "POST", "/update_weight_version", json={"new_version": str(version)})
        finally:
            step("resume_s", "POST", "/resume")
        t["weight_version"] = step("info", "GET", "/weight_info").json()["weight_version"]
    return t


def perturbed_copy(src: Path, dst: Path, scale: float = 0.05, seed: int = 1) -> Path:
    """An HF directory like `src` whose weights carry seeded noise: a stand-in for a trained policy."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    weights = load_file(str(src / "model.safetensors"))
    g = torch.Generator().manual_seed(seed)
    noisy = {
        k: v + scale * torch.randn(v.shape, generator=g, dtype=v.dtype)
        if v.is_floating_point()
        else v
        for k, v in weights.items()
    }
    save_file(noisy, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def eos_leaning_copy(
    src: Path, dst: Path, eos_id: int = 2, shift: float = 1.0, bonus: float = 0.9
) -> Path:
    """An HF directory like `src` whose model ends its answers after a few tokens (p(eos) ~ 0.3).

    A random tiny model almost never samples eos, and a harness fed endless text fails (Claude
    Code gives up on `max_tokens`). With tied embeddings, adding `shift` to one embedding
    dimension of every token makes that dimension dominate the final normed state without
    changing the softmax (every logit moves alike); `bonus` more on eos's row then lifts eos alone.
    """
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    weights = load_file(str(src / "model.safetensors"))
    emb = weights["model.embed_tokens.weight"].clone()
    emb[:, 0] += shift
    emb[eos_id, 0] += bonus
    weights["model.embed_tokens.weight"] = emb.to(torch.float32)
    save_file(weights, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


class Reference:
    """Transformers logprobs of recorded tokens, the slow obviously-correct side of the check."""

    def __init__(self, model_dir: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        self.model.eval()

    def logprobs(
        self, prompt_ids: list[int], completion_ids: list[int], sampling: dict | None = None
    ) -> list[float]:
        """log p(completion_ids[i] | prompt + completion[:i]) under a call's `sampling` (default
        temperature 1, no truncation): log_softmax(logits / T) over the top_k, then top_p kept
        set (vLLM's rule: sorted ascending, drop while the cumulative probability <= 1 - top_p),
        renormalised; 0.0 for greedy (T = 0) tokens."""
        torch = self.torch
        s = sampling or {}
        t, top_p, top_k = s.get("temperature", 1.0), s.get("top_p", 1.0), s.get("top_k", 0)
        if t == 0:
            return [0.0] * len(completion_ids)
        ids = torch.tensor([prompt_ids + completion_ids])
        with torch.no_grad():
            logits = self.model(ids).logits[0, len(prompt_ids) - 1 : -1].float() / t
        if 0 < top_k < logits.shape[-1]:
            kth = logits.topk(top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, -torch.inf)
        if top_p < 1:
            asc, idx = logits.sort(dim=-1)
            drop = torch.softmax(asc, -1).cumsum(-1) <= 1 - top_p
            drop[:, -1] = False
            logits = logits.scatter(1, idx, asc.masked_fill(drop, -torch.inf))
        lp = torch.log_softmax(logits, dim=-1)
        return lp.gather(1, torch.tensor(completion_ids)[:, None])[:, 0].tolist()


def prefill_counters(url: str) -> dict[str, float]:
    """vLLM's prompt-token counters from /metrics, summed over engines: `prompt_tokens` (all
    prompt tokens), `computed` (prefilled), `cached` (served from the prefix cache),
    `cache_queries` / `cache_hits` (tokens looked up / found) and `requests` (finished)."""
    names = {
        "vllm:prompt_tokens_total": "prompt_tokens",
        'vllm:prompt_tokens_by_source_total{source="local_compute"}': "computed",
        'vllm:prompt_tokens_by_source_total{source="local_cache_hit"}': "cached",
        "vllm:prefix_cache_queries_total": "cache_queries",
        "vllm:prefix_cache_hits_total": "cache_hits",
        "vllm:request_success_total": "requests",
    }
    out = dict.fromkeys(names.values(), 0.0)
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        sample, value = line.rsplit(" ", 1)
        name, _, labels = sample.partition("{")
        source = next((x for x in labels.rstrip("}").split(",") if x.startswith("source=")), "")
        key = names.get(f"{name}{{{source}}}" if source else name)
        if key:
            out[key] += float(value)
    return out
