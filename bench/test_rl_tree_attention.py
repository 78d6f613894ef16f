"""claw-rl: peak memory and time of one learner update on one tree, dense mask vs tree attention.

One session-shaped tree per size (4K, 8K, 16K, 64K tokens; bench/rl_tree_shapes.py): a system
prompt, a main agent thread of alternating completions (trained) and tool results, sub-agent
threads and compaction restarts branching from the system prompt, side calls branching from
earlier threads' history. One GRPOLearner.step (old-logprob pass + one update) on the tiny model
(max_position_embeddings 65536), micro-batch 1, in a fresh subprocess per run: peak RSS
growth during the step (the kernel's high-water mark, reset right before it) and wall time.

``dense`` packs with a (1, 1, N, N) mask (SDPA); ``tree`` with preorder intervals and
block-sparse tree attention (claw_rl._tree_attention). Dense at 64K is not run: its mask alone
is 4 GiB of bool before SDPA expands it; the 4K-16K trend is printed instead.

Run: .venvs/claw-rl/bin/python -m pytest bench/test_rl_tree_attention.py --benchmark-only -s
(5-10 minutes on 2 shared cores; 64K tree alone ~4 min). One run by hand:
.venvs/claw-rl/bin/python bench/test_rl_tree_attention.py 16384 tree
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rl_tree_shapes import session_tree  # noqa: E402

SIZES = (4096, 8192, 16384, 65536)
DENSE_SIZES = (4096, 8192, 16384)


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def measure(n_tokens: int, attention: str, model_dir: str) -> dict:
    """One update in this process: {tokens, attention, peak_mib, seconds}."""
    import claw_rl
    from claw_rl import packing

    # "dense": every tree gets the mask; "tree": none does (N > 0)
    packing.DENSE_MAX_TOKENS = 1 << 40 if attention == "dense" else 0
    cfg = claw_rl.GRPOConfig(lr=1e-5, micro_batch_size=1)
    if hasattr(claw_rl, "Learner"):  # the learner API after the learner/ppo merge
        learner = claw_rl.Learner.grpo(cfg, model_dir)
    else:
        learner = claw_rl.GRPOLearner(cfg, model_dir)
    tree = session_tree(n_tokens)
    learner.step([session_tree(4096, seed=1)])  # a warm-up step: lazy allocations
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak-RSS high-water mark
    base = _rss_kb("VmRSS")
    t0 = time.perf_counter()
    learner.step([tree])
    seconds = time.perf_counter() - t0
    return {
        "tokens": n_tokens,
        "attention": attention,
        "peak_mib": (_rss_kb("VmHWM") - base) / 1024,
        "seconds": seconds,
    }


def _run(n_tokens: int, attention: str, model_dir: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    env["MALLOC_MMAP_THRESHOLD_"] = "131072"  # big buffers mmapped: RSS follows live tensors
    done = subprocess.run(
        [sys.executable, __file__, str(n_tokens), attention, model_dir],
        capture_output=True,
        text=True,
        env=env,
    )
    if done.returncode:
        raise RuntimeError(f"{n_tokens} {attention}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from claw_rl import init_tiny

    return str(init_tiny(tmp_path_factory.mktemp("m") / "tiny"))


def test_tree_attention_memory_and_time(benchmark, model_dir):
    """Peak memory and time of one update, dense mask vs tree attention, 4K-64K tree tokens."""
    rows = []

    def tree_64k():
        rows.append(_run(65536, "tree", model_dir))

    benchmark.pedantic(tree_64k, rounds=1, iterations=1)
    rows += [_run(n, "tree", model_dir) for n in SIZES[:-1]]
    rows += [_run(n, "dense", model_dir) for n in DENSE_SIZES]
    by = {(r["attention"], r["tokens"]): r for r in rows}
    print()
    for n in SIZES:
        t, d = by[("tree", n)], by.get(("dense", n))
        line = f"{n:>6} tokens | tree {t['peak_mib']:8.0f} MiB {t['seconds']:6.1f} s"
        if d:
            line += (
                f" | dense {d['peak_mib']:8.0f} MiB {d['seconds']:6.1f} s"
                f" | dense/tree memory {d['peak_mib'] / t['peak_mib']:.1f}x"
                f" time {d['seconds'] / t['seconds']:.1f}x"
            )
        else:
            line += " | dense not run (the mask alone is N^2 bytes: 4 GiB at 64K)"
        print(line)
    ratio = by[("tree", 65536)]["peak_mib"] / by[("tree", 8192)]["peak_mib"]
    dense_growth = by[("dense", 16384)]["peak_mib"] / by[("dense", 8192)]["peak_mib"]
    print(
        f"tree 64K / 8K peak memory {ratio:.2f}x (goal <= 8x); dense 16K / 8K {dense_growth:.2f}x"
    )
    benchmark.extra_info.update(rows=rows, tree_64k_over_8k_memory=ratio)
    assert ratio <= 8.0


if __name__ == "__main__":
    if len(sys.argv) < 4:
        import tempfile

        from claw_rl import init_tiny

        sys.argv.append(str(init_tiny(os.path.join(tempfile.mkdtemp(), "tiny"))))
    print(json.dumps(measure(int(sys.argv[1]), sys.argv[2], sys.argv[3])))
