"""examples/mix_harness_rl.py beyond one process: its rollouts on a two-node Ray cluster (a worker
node killed mid-step loses nothing), and its metrics rows in an offline W&B run."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[1]
LOOP = ROOT / "examples" / "mix_harness_rl.py"
RAY = Path(sys.executable).with_name("ray")
# a token of its own: Ray's default (~/.ray/auth_token) is shared with every other Ray user here
RAY_ENV = {"RAY_ADDRESS": "", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
TINY = ["--task", "toy-digits", "--harness", "claw-agent-text", "--seed", "0"]


def _rows(path: Path) -> list[dict]:
    """Complete JSONL lines only: a line still being written is not read."""
    text = path.read_text() if path.exists() else ""
    return [json.loads(x) for x in text[: text.rfind("\n") + 1].splitlines() if x.strip()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _tree(pid: int) -> list[int]:
    """pid and all its descendants, read from /proc."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        out.append(p := todo.pop())
        todo.extend(children.get(p, []))
    return out


def _kill_tree(pid: int) -> None:
    """SIGKILL a node's processes (raylet, its Ray workers and their sandboxes), each by its pid."""
    for p in _tree(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def _cmdlines(pids: list[int]) -> list[str]:
    out = []
    for p in pids:
        with contextlib.suppress(OSError):
            out.append(Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode())
    return out


def _start_node(temp: Path, name: str, *args: str) -> subprocess.Popen:
    """`ray start --block` in a session of its own: the node lives as long as this process."""
    common = ["--block", "--temp-dir", str(temp), "--num-cpus", "2", "--disable-usage-stats",
              "--object-store-memory", str(80 * 2**20), "--metrics-export-port", str(_free_port()),
              "--dashboard-agent-listen-port", str(_free_port())]  # fmt: skip
    with (temp / f"{name}.log").open("w") as log:
        return subprocess.Popen([str(RAY), "start", *args, *common], stdout=log, stderr=log,
                                env={**os.environ, **RAY_ENV}, start_new_session=True)  # fmt: skip


def _nodes(address: str) -> dict[str, dict]:
    """node id -> {resources, ip} of the cluster's live nodes (a short-lived driver)."""
    code = (
        "import json, sys, ray; ray.init(address=sys.argv[1], log_to_driver=False); "
        "print(json.dumps({n['NodeID']: {'resources': n['Resources'], "
        "'ip': n['NodeManagerAddress']} for n in ray.nodes() if n['Alive']}))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, address],
        capture_output=True, text=True, timeout=120, env={**os.environ, **RAY_ENV},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.splitlines()[-1])


@contextlib.contextmanager
def _cluster():
    """A head (resource node_a) and a worker raylet (node_b) on this machine, 2 CPUs each, in a
    private temp dir and with a token of their own; both stopped (their process trees killed by
    pid) at the end. Yields (address, {"node_a": id, "node_b": id}, ip, worker process)."""
    temp = Path(tempfile.mkdtemp(prefix="claw-ray-", dir="/tmp"))  # short: Ray's socket paths
    port, procs = _free_port(), []
    try:
        procs.append(_start_node(temp, "head", "--head", "--port", str(port),
                                 "--include-dashboard", "false", "--resources", '{"node_a": 8}'))  # fmt: skip
        address = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while _closed(port):
            assert procs[0].poll() is None, (temp / "head.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the Ray head did not start"
            time.sleep(0.5)
        procs.append(_start_node(temp, "worker", "--address", address,
                                 "--resources", '{"node_b": 8}'))  # fmt: skip
        while len(nodes := _nodes(address)) < 2:
            assert procs[1].poll() is None, (temp / "worker.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the Ray worker node did not join"
            time.sleep(1)
        ids = {r: n for n, v in nodes.items() for r in ("node_a", "node_b") if r in v["resources"]}
        yield address, ids, nodes[ids["node_a"]]["ip"], procs[1]
    finally:
        for p in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)  # ray start --block: stops its node's processes
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(30)
            _kill_tree(p.pid)  # whatever did not stop
        shutil.rmtree(temp, ignore_errors=True)


def _bwrap_works() -> bool:
    return bool(shutil.which("bwrap")) and (
        subprocess.run(["bwrap", "--ro-bind", "/", "/", "--unshare-net", "true"]).returncode == 0
    )


def _kill_worker_mid_step(proc: subprocess.Popen, run: Path, worker: subprocess.Popen) -> float:
    """Once step 1 runs and a harness runs in a sandbox on the worker node, kill that node."""
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the loop ended before step 1 ran on the worker node"
        started = (run / "steps" / "0001" / "jobs-a0.jsonl").exists()
        if started and any("claw_bench.agent" in c for c in _cmdlines(_tree(worker.pid))):
            _kill_tree(worker.pid)
            return time.monotonic()
        time.sleep(0.05)
    raise AssertionError("no harness ever ran on the worker node in step 1")


@pytest.mark.slow
def test_loop_on_a_two_node_ray_cluster_loses_nothing_when_a_worker_dies(tmp_path):
    """Two GRPO steps of the loop with --executor ray on a head and a worker raylet: step 0's
    run records name both nodes; the worker node is killed (every process of it, SIGKILL) while
    it runs step 1's rollouts; the lost rollouts are planned again under new sessions (attempt
    a1) and run on the head. Every planned rollout of both steps has exactly one run record and
    one outcome, none an infra error, and no lost session's calls are trained on. With bwrap the
    proxy listens on the node's address (--proxy-host), as it must across machines."""
    pytest.importorskip("ray", reason="ray is not installed (pip install 'claw-sandbox[ray]')")
    run, log = tmp_path / "run", tmp_path / "loop.log"
    n = 6  # rollouts a step: 1 task x 1 harness x 6
    t0 = time.monotonic()
    with _cluster() as (address, ids, ip, worker):
        bwrap = _bwrap_works()  # process: one host relay per port, so the proxy stays on loopback
        args = [sys.executable, str(LOOP), "--run-dir", str(run), "--steps", "2", "--rollouts",
                str(n), "--parallel", "4", *TINY, "--executor", "ray", "--ray-address", address,
                "--backend", "bwrap" if bwrap else "process",
                "--proxy-host", ip if bwrap else "127.0.0.1"]  # fmt: skip
        with log.open("w") as err:
            proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err,
                                    env={**os.environ, **RAY_ENV})  # fmt: skip
            try:
                killed = _kill_worker_mid_step(proc, run, worker)
                assert proc.wait(900) == 0, log.read_text()[-4000:]
            finally:
                if proc.poll() is None:
                    proc.kill()
    took = time.monotonic() - t0
    text = log.read_text()
    assert "lost with their Ray node or worker; planning them again" in text, text[-3000:]

    node = {v: k for k, v in ids.items()}
    schema = json.loads((ROOT / "formats" / "claw.run.v1.schema.json").read_text())
    per_step = []
    for step in ("0000", "0001"):
        d = run / "steps" / step
        runs, outcomes = _rows(d / "runs.jsonl"), _rows(d / "outcomes.jsonl")
        keys = [(o["task"], o["harness"], o["sample"]) for o in outcomes]
        assert len(keys) == len(set(keys)) == n, (step, keys)
        assert sorted(
            (r["meta"]["task"], r["meta"]["harness"], r["meta"]["sample"]) for r in runs
        ) == sorted(keys)
        assert len({r["job_id"] for r in runs}) == n
        assert all(r["status"] == "ok" and r["node"] in node for r in runs), runs
        for r in runs:
            jsonschema.validate(r, schema)
        assert all(o["status"] == "ok" for o in outcomes), outcomes
        assert {o["session"] for o in outcomes} == {r["meta"]["session"] for r in runs}
        trained = {x for s in _rows(d / "samples.jsonl") for x in s["sessions"]}
        assert trained <= {o["session"] for o in outcomes}
        per_step.append(Counter(node[r["node"]] for r in runs))
    assert set(per_step[0]) == {"node_a", "node_b"}, per_step  # step 0 ran on both nodes
    # step 1: the worker was killed mid-step; its rollouts were planned again (attempt a1) and
    # ran on the head (every later run record of the step names node_a)
    step1 = run / "steps" / "0001"
    again = _rows(step1 / "jobs-a1.jsonl")
    assert again and not (step1 / "jobs-a2.jsonl").exists()
    by_job = {r["job_id"]: r for r in _rows(step1 / "runs.jsonl")}
    assert all(node[by_job[j["job_id"]]["node"]] == "node_a" for j in again)
    metrics = _rows(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1] and all(m["infra_errors"] == 0 for m in metrics)
    assert [p["version"] for p in _rows(run / "policies.jsonl")] == [1, 2]
    print(f"{took:.0f}s; jobs per node by step {per_step}; {len(again)} rollouts lost and rerun;"
          f" the kill at {killed - t0:.0f}s; backend {'bwrap' if bwrap else 'process'}")  # fmt: skip


def _loop_module():
    sys.path.insert(0, str(LOOP.parent))
    try:
        import mix_harness_rl
    finally:
        sys.path.remove(str(LOOP.parent))
    return mix_harness_rl


def test_loop_resumes_with_other_places_to_run_and_serves_replicas(tmp_path):
    """--executor, --ray-address, --proxy-host, --tensorboard and --wandb change no step: a
    resumed run may change them, not --replica. The proxy holds the --replica engines behind
    the policy's (one proxy for all) and listens on --proxy-host."""
    import claw_rl

    m = _loop_module()
    run = ["--run-dir", str(tmp_path / "run")]
    m.prepare_run_dir(m.options(run))
    m.prepare_run_dir(m.options([*run, "--executor", "ray", "--ray-address", "10.0.0.1:6379",
                                 "--proxy-host", "10.0.0.2", "--wandb", "--tensorboard"]))  # fmt: skip
    with pytest.raises(SystemExit, match="replica"):
        m.prepare_run_dir(m.options([*run, "--replica", "vllm:http://h:1"]))
    # a run begun before the script had an option reopens with that option at its default only
    config = tmp_path / "run" / "config.json"
    config.write_text(json.dumps({k: v for k, v in json.loads(config.read_text()).items()
                                  if k != "routing_replay"}))  # fmt: skip
    with pytest.raises(SystemExit, match="routing_replay"):
        m.prepare_run_dir(m.options([*run, "--routing-replay", "off"]))
    m.prepare_run_dir(m.options(run))

    claw_rl.init_tiny(tmp_path / "tiny", claw_rl.TinySpec())  # the vllm engines' tokenizer
    args = m.options([*run, "--engine", "vllm:http://127.0.0.1:9", "--replica",
                      "vllm:http://127.0.0.1:10", "--proxy-host", "127.0.0.1"])  # fmt: skip
    with m.serve(args, "s", args.engine, tmp_path / "c.jsonl", str(tmp_path / "tiny")) as proxy:
        engines = proxy.proxy.policy_engine
        assert [e.spec for e in engines.replicas] == [
            "vllm:http://127.0.0.1:9",
            "vllm:http://127.0.0.1:10",
        ]
        assert proxy.host == "127.0.0.1"


@pytest.mark.slow
def test_loop_wandb_offline_writes_a_run_wandb_sync_reads(tmp_path):
    """One step of the loop with --wandb and WANDB_MODE=offline: RUN/wandb holds one offline run
    (a run-*.wandb file with its header, run and exit records) whose history is every number of
    the step's metrics row at its step, as claw-rl train|sft log theirs."""
    pytest.importorskip("wandb", reason="the wandb extra is not installed (claw-rl[wandb])")
    from claw_rl.tensorboard import scalars
    from test_tracking import _history, _wandb_records  # claw-rl's reading of a .wandb file

    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    env.update({v: str(tmp_path / v.lower()) for v in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR",
                                                         "WANDB_DATA_DIR")})  # fmt: skip
    run = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, str(LOOP), "--run-dir", str(run), "--steps", "1", "--rollouts", "2",
         "--backend", "process", *TINY, "--wandb"],
        cwd=ROOT, capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    (row,) = _rows(run / "metrics.jsonl")
    want = {row["step"]: dict(scalars(row))}
    assert "learner/loss" in want[0] and "reward/claw-agent-text" in want[0], sorted(want[0])
    (run_file,) = (run / "wandb").glob("offline-run-*/run-*.wandb")
    records = _wandb_records(run_file)  # checks the ':W&B' header `wandb sync` checks
    kinds = {rec.WhichOneof("record_type") for rec in records}
    assert {"run", "history", "exit"} <= kinds
    got = _history(records)
    assert set(got) == set(want) and set(got[0]) == set(want[0])
    assert got[0] == pytest.approx(want[0])
