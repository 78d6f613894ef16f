"""New weights to an engine in memory vs through files (issue 41): wall time, bytes and peak
extra memory on both sides, for random Qwen3 policies of about 50M, 150M and 500M parameters on
the CPU (gloo), in one run so the ratios share the machine's load.

Run: .venvs/workspace/bin/python -m pytest bench/test_weight_transfer_speed.py -s -p no:cacheprovider
(by default 50M and 150M, each route twice: ~1.5 min on 2 loaded cores.
CLAW_BENCH_TRANSFER_SIZES=50M,150M,500M adds the 500M case (~2 GB a copy, ~1.5 min more, ~7 GB
of RAM at the peak); CLAW_BENCH_TRANSFER_VLLM=1 adds the 50M policy into vLLM's CPU build from
.venvs/vllm (~2 min, most of it the server's start); CLAW_BENCH_TRANSFER_REPS=N runs each
route N times.) The tables go to stdout and to
pytest-benchmark's extra_info; docs/weights.md has the numbers and the 30B extrapolation.

Per size, a random Qwen3 (a transformers Qwen3Config built here: float32, tied embeddings, the
tiny fixture's tokenizer and 2078-token vocabulary; written to a temporary directory, never to
the repo) is both the learner's policy (claw_rl.Learner.grpo) and the engine's: `claw-proxy
serve --engine transformers:DIR` in its own process. The routes, one after another:
- memory: claw_rl.transfer.publish, the learner rank 0 of a gloo group on loopback and the
  proxy's engine rank 1, with the default bucket (256 MiB) and a 16 MiB one. Time: publish's
  wall, from its TCP store's start to the proxy's answer, which comes once the engine serves the
  new version.
- disk: claw_rl.save_policy into a fresh directory (what the loop does with --weights disk: no
  fsync), then an fsync of each of its files (a durable write; the issue's 27-49 MB/s were with
  fsync), then POST /admin/policy with that path: the engine's from_pretrained reads the files
  from the page cache ("hot": a reader on the same box right after the write), and once more
  after posix_fadvise(DONTNEED) dropped their pages ("cold": a reader on another node, or after
  eviction).
After each route one call through the proxy must record the new version.

Peak extra memory of a side = its high-water RSS during the route (VmHWM, reset through
/proc/PID/clear_refs before the route) minus its RSS before the route: the learner is this
process, the engine the proxy's process (for vLLM, the largest over its server's process tree).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch
from claw_proxy import AdminClient, ProxyConfig, ProxyServer, mint_token
from claw_rl import GRPOConfig, Learner, transfer
from claw_rl.checkpoint import save_policy
from proc_stats import free_port, wait_ready  # bench/ is on pytest's pythonpath
from transformers import Qwen3Config, Qwen3ForCausalLM

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "tiny-qwen3"
VLLM_PY = Path(os.environ.get("CLAW_VENVS", ROOT / ".venvs")) / "vllm" / "bin" / "python"
SECRET, ADMIN = "bench-secret", "bench-admin-token"
SMALL_BUCKET = 16 << 20
MB = 1e6
# (hidden, intermediate, layers, heads, kv heads): ~48M, ~149M, ~505M parameters at vocab 2078
SHAPES = {
    "50M": (512, 2048, 12, 8, 4),
    "150M": (768, 3072, 17, 12, 4),
    "500M": (1024, 4096, 32, 16, 8),
}
REPS = int(os.environ.get("CLAW_BENCH_TRANSFER_REPS", "2"))  # each route; the best one counts
SIZES = os.environ.get("CLAW_BENCH_TRANSFER_SIZES", "50M,150M").split(",")


# --- peak memory ---------------------------------------------------------------------------------


def _kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(f"/proc/{pid}/status has no {key}")


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants (from /proc/PID/task/*/children)."""
    out = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            for child in (task / "children").read_text().split():
                out += _tree(int(child))
    return out


class Peak:
    """Peak extra RSS (MB) of each process in `pids` over a `with` block; `.mb` is the largest
    over the processes. The peak is VmHWM after a reset on entry (clear_refs 5) and, since the
    kernel folds some RSS changes into VmHWM lazily, also VmRSS sampled every 5 ms; minus the
    RSS at entry."""

    def __init__(self, pids: list[int]) -> None:
        self.pids, self.mb = pids, 0.0
        self._seen: dict[int, int] = {}
        self._stop = threading.Event()

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            for pid in self.pids:
                with contextlib.suppress(OSError, KeyError):
                    self._seen[pid] = max(self._seen[pid], _kb(pid, "VmRSS"))

    def __enter__(self) -> Peak:
        self.base = {}
        for pid in self.pids:
            Path(f"/proc/{pid}/clear_refs").write_text("5")
            self.base[pid] = self._seen[pid] = _kb(pid, "VmRSS")
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        peaks = {p: max(_kb(p, "VmHWM"), self._seen[p]) for p in self.pids}
        self.mb = max((peaks[p] - b) * 1024 / MB for p, b in self.base.items())


# --- the policy and the engine -------------------------------------------------------------------


def _model_dir(out: Path, size: str) -> tuple[Path, int]:
    """A random Qwen3 of `size` as an HF directory with the tiny tokenizer; its parameter count."""
    hidden, inter, layers, heads, kv = SHAPES[size]
    cfg = Qwen3Config(
        vocab_size=2078, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=64, tie_word_embeddings=True,
        max_position_embeddings=4096, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg)
    model.save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy2(TINY / f, out / f)
    return out, sum(p.numel() for p in model.parameters())


def _serve(model: Path, tmp: Path) -> tuple[subprocess.Popen, str]:
    """`claw-proxy serve --engine transformers:MODEL` in its own process; (process, url)."""
    (tmp / "secret").write_text(SECRET + "\n")
    (tmp / "admin").write_text(ADMIN + "\n")
    port = free_port()
    argv = [str(Path(sys.executable).parent / "claw-proxy"), "serve"]
    argv += ["--engine", f"transformers:{model}", "--port", str(port)]
    argv += ["--secret-file", str(tmp / "secret"), "--admin-token-file", str(tmp / "admin")]
    argv += ["--record", str(tmp / "calls.jsonl")]
    with (tmp / "proxy.log").open("w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/v1/models", proc, 300)
    return proc, url


def _served_version(url: str, record: Path) -> tuple[int, float]:
    """One call through the proxy (a session of its own): the policy version its record names,
    and the call's seconds."""
    session = f"check-{time.monotonic_ns()}"
    headers = {"authorization": f"Bearer {mint_token(session, SECRET)}"}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    t0 = time.monotonic()
    r = httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=300)
    took = time.monotonic() - t0
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the record is written right after the answer
        for line in record.read_text().splitlines():
            if line.strip() and (call := json.loads(line))["session"] == session:
                return call["policy"]["version"], took
        time.sleep(0.05)
    raise AssertionError(f"no call record of {session} in {record}")


# --- the routes ----------------------------------------------------------------------------------


def _memory(learner: Learner, url: str, bucket: int, engine_pids: list[int], check) -> dict:
    """claw_rl.transfer.publish of a new version with `bucket`-byte buckets, then a call."""
    learner.dirty = True
    policy = transfer.next_policy(learner, str(learner.model_dir))
    with Peak([os.getpid()]) as mine, Peak(engine_pids) as theirs:
        t0 = time.monotonic()
        sent = transfer.publish(learner, policy, url, ADMIN, bucket_bytes=bucket)
        wall = time.monotonic() - t0
        version, first = check()
    assert sent["answer"]["policy"]["version"] == policy["version"] == version
    assert not sent["failed_ranks"]
    return {
        "version": version, "s": wall, "first_call_s": first, "bytes": sent["bytes"],
        "buckets": sent["buckets"], "learner_mb": mine.mb, "engine_mb": theirs.mb,
    }  # fmt: skip


def _fsync_evict(d: Path, evict: bool) -> float:
    """fsync every file under `d` (seconds taken); with `evict`, drop their cached pages
    (pages a process maps stay: evict before any engine maps the files)."""
    t0 = time.monotonic()
    for f in sorted(p for p in d.rglob("*") if p.is_file()):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            if evict:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return time.monotonic() - t0


def _disk(learner: Learner, url: str, out: Path, engine_pids: list[int], check) -> dict:
    """save_policy (no fsync, as the loop), fsync; the engine's reload cold (pages dropped),
    then hot (the same files again, cached), each followed by a call (transformers maps the
    safetensors lazily: the weights are read when the first forward touches them)."""
    learner.dirty = True
    with Peak([os.getpid()]) as mine:
        t0 = time.monotonic()
        policy = save_policy(learner, out)
        write = time.monotonic() - t0
    fsync = _fsync_evict(out, evict=False)
    nbytes = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    got: dict = {"write_s": write, "fsync_s": fsync, "bytes": nbytes, "learner_mb": mine.mb}
    with AdminClient(url, ADMIN, timeout=600) as admin:
        for how in ("cold", "hot"):
            if how == "cold":
                _fsync_evict(out, evict=True)
            else:
                policy = {**policy, "version": policy["version"] + 1}
            with Peak(engine_pids) as theirs:
                t0 = time.monotonic()
                admin.reload(policy)
                got[f"{how}_s"] = time.monotonic() - t0
                version, got[f"{how}_first_call_s"] = check()
            assert version == policy["version"]
            got[f"{how}_engine_mb"] = theirs.mb
    learner.version = got["version"] = policy["version"]
    return got


def _served_s(route_s: float, first_call_s: float, warm_call_s: float) -> float:
    """A route's seconds until the engine serves at full speed: the route, plus what its first
    call took beyond a warm call (the lazy read of mapped weights)."""
    return route_s + max(0.0, first_call_s - warm_call_s)


def _summary(mem: dict[str, dict], disk: dict, warm: float) -> dict:
    """Each route's seconds to serving (see `_served_s`) and their ratios to memory's best."""
    out = {f"memory {k}": _served_s(m["s"], m["first_call_s"], warm) for k, m in mem.items()}
    d = disk
    out["disk hot (write + load)"] = d["write_s"] + _served_s(
        d["hot_s"], d["hot_first_call_s"], warm
    )
    out["disk cold (write + fsync + load)"] = (
        d["write_s"] + d["fsync_s"] + _served_s(d["cold_s"], d["cold_first_call_s"], warm)
    )
    best = min(v for k, v in out.items() if k.startswith("memory"))
    return {"served_s": out, "ratio_to_memory": {k: v / best for k, v in out.items()}}


def _table(size: str, params: int, mem: dict[str, dict], disk: dict, warm: float, engine: str):
    rows = [f"{size} ({params / 1e6:.0f}M params, float32) into {engine}; a warm call {warm:.2f} s"]
    for name, m in mem.items():
        rows.append(
            f"  memory {name:>7} buckets: publish {m['s']:5.2f} s, {m['bytes'] / MB:6.1f} MB in "
            f"{m['buckets']:3d} buckets ({m['bytes'] / MB / m['s']:5.0f} MB/s), first call "
            f"{m['first_call_s']:.2f} s; peak extra: learner {m['learner_mb']:6.1f} MB, engine "
            f"{m['engine_mb']:6.1f} MB"
        )
    d = disk
    rows.append(
        f"  disk: save_policy {d['write_s']:.2f} s ({d['bytes'] / MB / d['write_s']:.0f} MB/s), "
        f"then fsync {d['fsync_s']:.2f} s; peak extra: learner {d['learner_mb']:.1f} MB"
    )
    for how in ("cold", "hot"):
        rows.append(
            f"  disk {how:>4} load: reload {d[how + '_s']:.2f} s, first call "
            f"{d[how + '_first_call_s']:.2f} s; peak extra: engine {d[how + '_engine_mb']:.1f} MB"
        )
    summary = _summary(mem, disk, warm)
    rows.append("  to serving, and ratio to memory's best:")
    for k, v in summary["served_s"].items():
        rows.append(f"    {k:<34} {v:6.2f} s  {summary['ratio_to_memory'][k]:5.2f}x")
    return "\n".join(rows)


def _best(runs: list[dict], keys: tuple[str, ...]) -> dict:
    """The run with the least sum of `keys` (the machine is shared: the least disturbed), with
    every run's sum under ``runs_s``."""
    sums = [sum(r[k] for k in keys) for r in runs]
    return {**runs[sums.index(min(sums))], "runs_s": [round(x, 3) for x in sums]}


def _routes(learner: Learner, url: str, pids: list[int], tmp: Path, check) -> list:
    """A warm-up, then the memory routes (default and small bucket) and the disk route, each
    REPS times (the best run of each is reported).

    The warm-up makes the measured updates those of a running loop: the learner's and the
    engine's weights are both loaded through mmap, so the first write to them (the learner's
    update, the engine's first update in place) turns file pages into the process's own."""
    with torch.no_grad():
        for p in learner.policy.parameters():
            p.mul_(1.001)  # a stand-in for the optimizer's update
    _memory(learner, url, SMALL_BUCKET, pids, check)
    warm = min(check()[1] for _ in range(2))
    mem = {
        name: _best([_memory(learner, url, bucket, pids, check) for _ in range(REPS)], ("s",))
        for name, bucket in (("256 MiB", transfer.BUCKET_BYTES), ("16 MiB", SMALL_BUCKET))
    }
    disks = []
    for _ in range(REPS):
        disks.append(_disk(learner, url, tmp / f"v{learner.version + 1}", pids, check))
    disk = _best(disks, ("write_s", "fsync_s", "cold_s", "cold_first_call_s"))
    return [mem, disk, warm]


@pytest.mark.parametrize("size", list(SHAPES))
def test_transformers_engine_memory_vs_disk(benchmark, tmp_path, size):
    """A claw-proxy transformers engine in another process takes each new version in memory
    (two bucket sizes) and from a policy directory (hot and cold reads); every route ends with
    the engine serving the version."""
    if size not in SIZES:
        pytest.skip(f"{size}: set CLAW_BENCH_TRANSFER_SIZES to include it")
    model, params = _model_dir(tmp_path / "v0", size)
    proc, url = _serve(model, tmp_path)
    try:
        learner = Learner.grpo(GRPOConfig(name="policy"), model)
        check = lambda: _served_version(url, tmp_path / "calls.jsonl")  # noqa: E731
        got: list = []
        benchmark.pedantic(
            lambda: got.extend(_routes(learner, url, [proc.pid], tmp_path, check)),
            rounds=1, iterations=1,
        )  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(30)
    mem, disk, warm = got
    summary = _summary(mem, disk, warm)
    benchmark.extra_info.update(params=params, memory=mem, disk=disk, warm_call_s=warm, **summary)
    print("\n" + _table(size, params, mem, disk, warm, "claw-proxy transformers engine (process)"))


# --- vLLM's CPU build ----------------------------------------------------------------------------


def _vllm_missing() -> str | None:
    if os.environ.get("CLAW_BENCH_TRANSFER_VLLM", "0") != "1":
        return "vLLM's server takes ~1 min to start here: CLAW_BENCH_TRANSFER_VLLM=1 runs it"
    if not VLLM_PY.exists():
        return f"vLLM is not installed ({VLLM_PY} missing)"
    r = subprocess.run([str(VLLM_PY), "-c", "import vllm"], capture_output=True, text=True)
    return None if r.returncode == 0 else f"vLLM does not import: {r.stderr.strip()[-300:]}"


@contextlib.contextmanager
def _vllm(model: Path, tmp: Path):
    """vLLM's OpenAI server on `model` (float32, eager, 256 MiB of KV cache) with the policy
    flags of examples/gpu/vllm-policy.args; yields (process, url, seconds to ready)."""
    gpu = ROOT / "examples" / "gpu"
    lines = (gpu / "vllm-policy.args").read_text().splitlines()
    flags = [x.strip() for x in lines if x.strip() and not x.startswith("#")]
    port = free_port()
    argv = [str(VLLM_PY), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    argv += ["--served-model-name", "policy", "--max-model-len", "2048", "--enforce-eager"]
    argv += ["--dtype", "float32", "--kv-cache-memory-bytes", str(256 << 20), "--seed", "0"]
    argv += ["--host", "127.0.0.1", "--port", str(port), *flags]
    argv += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "2048"]
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", PYTHONPATH=str(gpu))
    t0 = time.monotonic()
    with (tmp / "vllm.log").open("w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp)
    try:
        wait_ready(f"http://127.0.0.1:{port}/health", proc, 600)
        yield proc, f"http://127.0.0.1:{port}", time.monotonic() - t0
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_vllm_engine_memory_vs_disk(benchmark, tmp_path):
    """vLLM's CPU build behind claw-proxy (vllm:URL) takes the 50M policy's new versions in
    memory (claw_vllm_worker's claw_receive_weights over gloo) and from a policy directory
    (claw_reload_weights); every route ends with vLLM serving the version."""
    if why := _vllm_missing():
        pytest.skip(why)
    model, params = _model_dir(tmp_path / "v0", "50M")
    with _vllm(model, tmp_path) as (proc, vllm_url, ready_s):
        cfg = ProxyConfig(
            engine=f"vllm:{vllm_url}", tokenizer=str(model), secret=SECRET, admin_token=ADMIN,
            vllm_reload_method="claw_reload_weights", record=str(tmp_path / "calls.jsonl"),
        )  # fmt: skip
        with ProxyServer(cfg) as srv:
            learner = Learner.grpo(GRPOConfig(name="policy"), model)
            pids = _tree(proc.pid)
            check = lambda: _served_version(srv.url, tmp_path / "calls.jsonl")  # noqa: E731
            got: list = []
            benchmark.pedantic(
                lambda: got.extend(_routes(learner, srv.url, pids, tmp_path, check)),
                rounds=1, iterations=1,
            )  # fmt: skip
            weight_version = httpx.get(vllm_url + "/weight_info", timeout=30).json()
    mem, disk, warm = got
    assert weight_version["weight_version"] == str(learner.version)  # the last route's
    summary = _summary(mem, disk, warm)
    benchmark.extra_info.update(
        params=params, memory=mem, disk=disk, warm_call_s=warm, server_ready_s=ready_s, **summary
    )
    print(f"\nvLLM server ready in {ready_s:.0f} s")
    print(_table("50M", params, mem, disk, warm, "vLLM CPU (its server's process tree)"))
