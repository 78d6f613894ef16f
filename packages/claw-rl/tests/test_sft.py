"""Supervised fine-tuning on tree-packed samples: the packed NLL and its gradient equal those of
the flat batch (every root-to-leaf path its own sequence), for both SFT weightings of
`claw-tree sft-samples`; recorded sampling settings do not change the NLL; `claw-rl sft` end to end.

Tolerance as in test_packed_gradients.py: the packed forward reproduces the per-path forward up
to fp32 summation order (~1e-6 relative); 1e-5 absolute on gradient entries of O(1e-2..1).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from claw_rl import Learner
from claw_rl.cli import main
from claw_rl.config import CONFIGS, SFTConfig, config_from_toml
from claw_rl.packing import leaf_counts, path_matrix
from click.testing import CliRunner
from rl_testlib import run_checked, torchrun_cmd

TOL = 1e-5


def _tree(seed: int, n: int) -> tuple[list[int], list[int]]:
    """One root, mostly chains with branches; every leaf trainable, the root not."""
    rng = random.Random(seed)
    parent = [-1]
    for i in range(1, n):
        parent.append(i - 1 if rng.random() < 0.7 else rng.randrange(0, i))
    has_child = set(parent)
    trainable = [0] + [1 if (i not in has_child or rng.random() < 0.6) else 0 for i in range(1, n)]
    return parent, trainable


def _sft_batch(vocab: int, weighting: str, seed: int = 0) -> list[dict]:
    """Two random tree samples with claw-tree's SFT loss weights and their per-path shares
    ``_u`` (paths x tokens): token: u = 1 / (U c_v), U = trainable tokens of the batch;
    path: u = 1 / sum_p T_p (weight 1 per path)."""
    rng = np.random.default_rng(seed)
    trees = [_tree(seed * 10 + k, 14 + 3 * k) for k in range(2)]
    U = sum(sum(tr) for _, tr in trees)
    total_T = sum(int((path_matrix(p) & np.asarray(t, dtype=bool)).sum()) for p, t in trees)
    samples = []
    for k, (parent, trainable) in enumerate(trees):
        n = len(parent)
        pos: list[int] = []
        for p in parent:
            pos.append(0 if p < 0 else pos[p] + 1)
        paths = path_matrix(parent)
        tr = np.asarray(trainable, dtype=bool)
        if weighting == "token":
            u = (paths & tr) / (U * leaf_counts(parent)[None, :])
        else:
            u = (paths & tr) / total_T
        samples.append(
            {
                "schema": "claw.sample/v1",
                "sample_id": f"sft-{k}",
                "algo": "sft",
                "input_ids": rng.integers(3, vocab, n).tolist(),
                "position_ids": pos,
                "parent": parent,
                "trainable": trainable,
                "logprobs": [0.0] * n,
                "advantages": [0.0] * n,
                "loss_weights": u.sum(0).tolist(),
                "tags": {"sft_weighting": weighting},
                "_u": u,
            }
        )
    return samples


def _flat(samples: list[dict]) -> list[dict]:
    """Every root-to-leaf path as its own chain sample carrying its share of the weights."""
    out = []
    for s in samples:
        for p, row in enumerate(path_matrix(s["parent"])):
            idx = np.nonzero(row)[0]
            n = len(idx)
            out.append(
                {
                    "schema": "claw.sample/v1",
                    "sample_id": f"{s['sample_id']}-p{p}",
                    "algo": "sft",
                    "input_ids": [s["input_ids"][j] for j in idx],
                    "position_ids": list(range(n)),
                    "parent": list(range(-1, n - 1)),
                    "trainable": [s["trainable"][j] for j in idx],
                    "logprobs": [0.0] * n,
                    "advantages": [0.0] * n,
                    "loss_weights": [float(s["_u"][p, j]) for j in idx],
                }
            )
    return out


def _grads(learner: Learner, samples: list[dict]) -> tuple[dict[str, torch.Tensor], dict]:
    """One step; every trained parameter's gradient as the optimizer saw it, and the metrics."""
    seen: dict[str, torch.Tensor] = {}
    orig = learner.optimizer.step

    def capture(*a, **kw):
        for name, m in learner.trained_modules().items():
            for n, p in m.named_parameters():
                if p.grad is not None:
                    seen[f"{name}.{n}"] = p.grad.detach().clone()
        return orig(*a, **kw)

    learner.optimizer.step = capture
    rows = [{k: v for k, v in s.items() if k != "_u"} for s in samples]
    return seen, learner.step(rows)


def _config(**kw):
    return CONFIGS["sft"](lr=1e-3, max_grad_norm=0.0, **kw)


def _flat_nll(tiny, samples: list[dict]) -> float:
    """The flat batch's loss by hand: sum over paths and their trainable tokens of
    u_{p,t} * (-log pi(t | the path's prefix)), one plain causal forward per path."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32).eval()
    total = 0.0
    with torch.no_grad():
        for f in _flat(samples):
            x = torch.tensor([f["input_ids"]])
            logp = torch.log_softmax(model(input_ids=x).logits[0].double(), -1)
            for j, t in enumerate(f["trainable"]):
                if t:
                    total += f["loss_weights"][j] * float(-logp[j - 1, x[0, j]])
    return total


@pytest.mark.parametrize("weighting", ["token", "path"])
def test_packed_sft_gradient_equals_flat(tiny, weighting):
    """Packed and flat per-path SFT agree: the loss to 1e-6 (and equal to the hand-computed
    weighted NLL), every gradient entry to 1e-5."""
    a = Learner.sft(_config(), tiny)
    samples = _sft_batch(a.policy.config.vocab_size, weighting)
    assert sum(sum(s["loss_weights"]) for s in samples) == pytest.approx(1.0)
    g_tree, m_tree = _grads(a, samples)
    g_flat, m_flat = _grads(Learner.sft(_config(), tiny), _flat(samples))
    assert set(g_tree) == set(g_flat) and g_tree
    worst = max(float((g_tree[n] - g_flat[n]).abs().max()) for n in g_tree)
    assert max(float(g.abs().max()) for g in g_flat.values()) > 1e-3  # not two zero gradients
    assert worst <= TOL, f"sft ({weighting}): max |g_tree - g_flat| = {worst:.3g}"
    assert m_tree["loss"] == pytest.approx(m_flat["loss"], abs=1e-6)
    assert m_tree["loss"] == pytest.approx(_flat_nll(tiny, samples), abs=1e-5)
    assert m_tree["dedup_factor"] > 1.0  # the packed batch did share tokens


def test_sft_nll_ignores_recorded_sampling_settings(tiny):
    """A teacher token drawn greedily or at another temperature / top-k is a target like any
    other: the NLL is the policy's at temperature 1, so the step is the same as without them."""
    plain = _sft_batch(500, "token", seed=3)
    tagged = []
    for s in plain:
        n = len(s["input_ids"])
        tagged.append(
            {
                **s,
                "temperatures": [0.0 if i % 3 == 0 else 0.5 for i in range(n)],
                "top_ps": [0.9] * n,
                "top_ks": [5] * n,
            }
        )
    g_plain, m_plain = _grads(Learner.sft(_config(), tiny), plain)
    g_tagged, m_tagged = _grads(Learner.sft(_config(), tiny), tagged)
    assert m_tagged["loss"] == pytest.approx(m_plain["loss"], abs=1e-7)
    assert max(float((g_plain[n] - g_tagged[n]).abs().max()) for n in g_plain) <= 1e-7


def _write(path, rows):
    path.write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "_u"}) + "\n" for r in rows)
    )
    return path


def test_cli_sft_writes_policies_metrics_config_and_resumes(tiny, tmp_path):
    """`claw-rl sft`: a policy line per step on stdout, policy/vN, metrics, config.toml ([sft]),
    a checkpoint; --resume continues the versions and the optimizer state."""
    samples = _write(tmp_path / "s.jsonl", _sft_batch(2000, "token"))
    out = tmp_path / "run"
    args = ["sft", "--model", str(tiny), "--samples", str(samples), "-o", str(out)]
    r = CliRunner().invoke(
        main, [*args, "--lr", "1e-3", "--batch-size", "1", "--epochs", "2", "--name", "tiny"]
    )
    assert r.exit_code == 0, r.output
    policies = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(p["name"], p["version"]) for p in policies] == [("tiny", 1), ("tiny", 2)]
    assert (out / "policy" / "v2" / "model.safetensors").exists()
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1] and all(m["learner"]["loss"] > 0 for m in metrics)
    resolved = SFTConfig.from_dict(config_from_toml(out / "config.toml", "sft"))
    assert resolved == SFTConfig(lr=1e-3, epochs=2, name="tiny")
    assert json.loads((out / "checkpoints" / "0002" / "state.json").read_text())["algo"] == "sft"
    r = CliRunner().invoke(
        main,
        ["sft", "--resume", str(out), "--samples", str(samples), "-o", str(out)],
    )
    assert r.exit_code == 0, r.output
    assert [json.loads(x)["version"] for x in r.stdout.splitlines()] == [3]
    r = CliRunner().invoke(
        main,
        [
            "train",
            "--algo",
            "grpo",
            "--resume",
            str(out),
            "--samples",
            str(samples),
            "-o",
            str(tmp_path / "rl"),
        ],
    )
    assert r.exit_code != 0 and "sft" in r.output


def test_cli_sft_refuses_rl_samples_with_the_reason(tiny, tmp_path):
    """GRPO samples given to `claw-rl sft` fail naming the sample and `claw-tree sft-samples`."""
    rl = dict(_sft_batch(2000, "token")[0], algo="grpo")
    r = CliRunner().invoke(
        main,
        [
            "sft",
            "--model",
            str(tiny),
            "--samples",
            str(_write(tmp_path / "g.jsonl", [rl])),
            "-o",
            str(tmp_path / "run"),
        ],
    )
    assert r.exit_code == 1 and "sft-samples" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "run" / "policy").exists()


def _claw_rl(args: list[str], nproc: int) -> None:
    """Run the claw-rl CLI in a subprocess, under torchrun (gloo on CPU) when nproc > 1."""
    exe = str(Path(sys.executable).parent / "claw-rl")
    run_checked(torchrun_cmd(nproc, exe, *args) if nproc > 1 else [exe, *args])


@pytest.mark.slow
def test_cli_sft_under_torchrun_matches_one_process(tiny, tmp_path):
    """`torchrun --nproc_per_node 2 claw-rl sft`, then a --resume under torchrun, gives the
    weights of the same two commands in one process, to 1e-6 (float32 gradient-sum order)."""
    from safetensors.torch import load_file

    rows = _sft_batch(2000, "path") + _sft_batch(2000, "path", seed=1)
    samples = _write(
        tmp_path / "s.jsonl", [{**r, "sample_id": f"s{k}"} for k, r in enumerate(rows)]
    )
    for name, nproc in (("one", 1), ("two", 2)):
        out = tmp_path / name
        common = ["--samples", str(samples), "-o", str(out)]
        _claw_rl(["sft", "--model", str(tiny), *common, "--lr", "1e-3", "--batch-size", "2",
                  "--minibatches", "2", "--epochs", "2", "--micro-batch-size", "1"], nproc)  # fmt: skip
        _claw_rl(["sft", "--resume", str(out), *common, "--batch-size", "4"], nproc)
    one = load_file(tmp_path / "one" / "policy" / "v3" / "model.safetensors")
    two = load_file(tmp_path / "two" / "policy" / "v3" / "model.safetensors")
    assert set(one) == set(two)
    assert max(float((one[k] - two[k]).abs().max()) for k in one) <= 1e-6
    start = load_file(Path(tiny) / "model.safetensors")
    assert max(float((one[k] - start[k]).abs().max()) for k in one) > 1e-4  # it did train
