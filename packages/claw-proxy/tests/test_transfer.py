"""claw_proxy._transfer: the policy's transfer record checked, buckets unpacked, and the
receiving side of a gloo group against a plain sender thread (issue 41)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from claw_proxy import _transfer
from claw_proxy.errors import RecordError

BUCKET = {"names": ["w", "b"], "dtypes": ["bfloat16", "float32"], "shapes": [[3, 3], [2]]}


def _record(**kw) -> dict:
    return {"method": "broadcast", "address": "127.0.0.1:29555", "backend": "gloo",
            "buckets": [{**BUCKET, "bytes": 32 + 16}], **kw}  # fmt: skip


def test_the_record_is_checked_naming_the_field():
    """A good record passes; a wrong bucket size, backend or address names its field."""
    assert _transfer.check_transfer(_record(), "p")["buckets"][0]["bytes"] == 48
    with pytest.raises(RecordError, match=r"transfer.buckets\[0\]: field 'bytes' must be 48"):
        _transfer.check_transfer(_record(buckets=[{**BUCKET, "bytes": 40}]), "p")
    with pytest.raises(RecordError, match="field 'backend'"):
        _transfer.check_transfer(_record(backend="mpi"), "p")
    with pytest.raises(RecordError, match="field 'address'"):
        _transfer.check_transfer(_record(address="127.0.0.1:0"), "p")


def test_a_receiver_gets_the_buckets_a_sender_sends():
    """Rank 1 joins the group the store names, announces nothing itself, and unpacks the
    buckets rank 0 sends (tag = bucket index) into the same tensors."""
    w, b = torch.randn(3, 3).to(torch.bfloat16), torch.randn(2)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    rec = _record(address=f"127.0.0.1:{store.port}")
    rec["buckets"] = [{**BUCKET, "bytes": 48}] * 2

    def send() -> None:
        pg = dist.ProcessGroupGloo(dist.PrefixStore("claw/v3/", store), 0, 2, timedelta(seconds=30))
        for i in range(2):
            buf = torch.zeros(48, dtype=torch.uint8)
            buf[:18].copy_(w.reshape(-1).view(torch.uint8))
            buf[32:40].copy_((b * (i + 1)).view(torch.uint8))
            pg.send([buf], 1, i).wait()

    sender = threading.Thread(target=send)
    sender.start()
    group = _transfer.join(rec, 3, 1, 2, timeout=30)
    got = list(_transfer.receive(rec, group))
    sender.join()
    assert [[n for n, _ in pairs] for pairs in got] == [["w", "b"], ["w", "b"]]
    assert torch.equal(got[0][0][1], w) and torch.equal(got[1][1][1], b * 2)
    assert _transfer.received_bytes(rec) == 96


def test_checkpoint_names_are_views_into_the_fused_moe_weights():
    """transformers 5 keeps the tiny Qwen3-MoE's experts fused (gate_up_proj (E, 2I, H),
    down_proj (E, H, I)); the views under the checkpoint's per-expert names hold exactly the
    saved tensors, share the fused weights' storage (a copy into one changes the served
    weight), and the in-memory names stay."""
    from pathlib import Path

    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    moe = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "tiny-qwen3-moe"
    model = AutoModelForCausalLM.from_pretrained(moe)
    views = _transfer.checkpoint_views(model)
    saved = load_file(moe / "model.safetensors")
    assert set(saved) <= set(views) and all(torch.equal(views[n], t) for n, t in saved.items())
    fused = model.state_dict()["model.layers.1.mlp.experts.gate_up_proj"]  # (8, 128, 128)
    assert views["model.layers.1.mlp.experts.gate_up_proj"] is not None
    up = views["model.layers.1.mlp.experts.5.up_proj.weight"]  # rows 64.. of expert 5
    with torch.no_grad():
        up.copy_(torch.full((64, 128), 3.0))
    assert (fused[5, 64:] == 3.0).all() and not (fused[5, :64] == 3.0).any()
    assert (fused[4] != 3.0).all() and _transfer.checkpoint_views(model) is views


def test_a_part_that_is_no_strided_slice_is_refused():
    """An index map that no strides give (a permutation) is refused, naming the part."""
    from claw_proxy.errors import EngineError

    p = torch.zeros(2, 3)
    index = torch.arange(6).view(2, 3)
    assert _transfer._strided(p, index, index.t(), "t").shape == (3, 2)
    with pytest.raises(EngineError, match="'x' is not a strided slice"):
        _transfer._strided(p, index, torch.tensor([4, 0, 5]), "'x'")
