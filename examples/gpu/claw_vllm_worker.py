"""A vLLM worker extension: reload weights from an HF directory, keeping tied embeddings tied.

vLLM 0.32's in-place `reload_weights` (the `/collective_rpc` route) leaves the LM head of a
model with `tie_word_embeddings` (Qwen3 0.6B-4B, the tiny test model) on the old weights: the
checkpoint has no separate head, the reload logs "ParallelLMHead: Failed to load weights" and
skips its post-processing, and on the CPU backend the head's prepacked GEMM keeps the old
embedding, so every logprob afterwards is wrong (the new body with the old head). This
extension reloads, then re-ties the head to the new embedding and re-runs its weight
processing. Start the server with it on PYTHONPATH:

    PYTHONPATH=examples/gpu VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server \\
        --worker-extension-cls claw_vllm_worker.ClawWorkerExtension ...
    POST /collective_rpc {"method": "claw_reload_weights", "kwargs": {"weights_path": DIR}}

New weights in memory (a policy with ``transfer``, docs/formats.md claw.policy/v1): claw-proxy
calls ``claw_receive_weights`` through ``/collective_rpc``; each worker joins the learner's
process group at the rank the proxy assigned plus its own rank, receives the buckets one by one
and streams them into vLLM's in-place ``reload_weights(weights_iterator=...)`` (then re-ties a
tied LM head). gloo on CPU (vLLM's
CPU build has no native weight-transfer engine), NCCL on GPU.

It runs inside vLLM's worker processes, so it imports nothing from claw: `join`, `buckets` and
`unpack` repeat claw_proxy._transfer's (16-byte aligned tensors in flat byte buckets).
"""

import math
from datetime import timedelta

ALIGN = 16
ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4}
ITEMSIZE.update({"int16": 2, "int8": 1, "uint8": 1, "bool": 1})


def join(transfer: dict, version: int, rank: int, world_size: int, timeout: float = 300.0):
    """This process's rank in the learner's group for `version` (blocks until all joined)."""
    import torch.distributed as dist

    host, port = transfer["address"].rsplit(":", 1)
    t = timedelta(seconds=timeout)
    store = dist.TCPStore(host, int(port), is_master=False, timeout=t)
    store = dist.PrefixStore(f"claw/v{version}/", store)
    if transfer["backend"] == "nccl":
        return dist.ProcessGroupNCCL(store, rank, world_size, dist.ProcessGroupNCCL.Options())
    return dist.ProcessGroupGloo(store, rank, world_size, t)


def unpack(buf, bucket: dict):
    """(name, tensor) pairs of one bucket, views into the flat uint8 tensor `buf`."""
    import torch

    off = 0
    for name, dtype, shape in zip(bucket["names"], bucket["dtypes"], bucket["shapes"], strict=True):
        n = math.prod(shape) * ITEMSIZE[dtype]
        yield name, buf[off : off + n].view(getattr(torch, dtype)).view(shape)
        off += -(-n // ALIGN) * ALIGN


def buckets(transfer: dict, group, device: str = "cpu"):
    """Each bucket's (name, tensor) pairs as it arrives (one bucket in memory at a time)."""
    import torch

    for i, bucket in enumerate(transfer["buckets"]):
        buf = torch.empty(bucket["bytes"], dtype=torch.uint8, device=device)
        if transfer["backend"] == "nccl":
            group.broadcast(buf, 0).wait()
        else:
            group.recv([buf], 0, i).wait()
        yield list(unpack(buf, bucket))


class ClawWorkerExtension:
    """Mixed into vLLM's Worker class by `--worker-extension-cls`."""

    def claw_receive_weights(
        self, transfer: dict, version: int, rank: int, world_size: int
    ) -> dict:
        """Join the learner's group at `rank` + this worker's rank, stream every bucket into
        vLLM's in-place reload, re-tie a tied LM head; what was received."""
        device = "cuda" if transfer["backend"] == "nccl" else "cpu"
        group = join(transfer, version, rank + getattr(self, "rank", 0), world_size)
        count = [0]

        def pairs():  # streamed: one bucket in memory at a time
            for bucket in buckets(transfer, group, device):
                count[0] += len(bucket)
                yield from bucket

        # vLLM's in-place reload (what reload_weights does from files), fed from the group
        self.reload_weights(weights_iterator=pairs())
        names = count[0]
        nbytes = sum(b["bytes"] for b in transfer["buckets"])
        retied, repacked = _retie(self.model_runner.get_model())
        return {"tensors": names, "bytes": nbytes, "retied_lm_head": retied, "repacked": repacked}

    def claw_reload_weights(self, weights_path: str) -> dict:
        """reload_weights(weights_path) on this worker, then re-tie the LM head; what was done."""
        self.reload_weights(weights_path=weights_path)
        retied, repacked = _retie(self.model_runner.get_model())
        return {
            "weights_path": weights_path,
            "retied_lm_head": retied,
            "repacked_lm_head": repacked,
        }


def _retie(model) -> tuple[bool, bool]:
    """Re-tie a tied LM head to the (new) embedding and re-derive its backend weight."""
    config = getattr(model, "config", None)
    retied = repacked = False
    if getattr(config, "tie_word_embeddings", False) and hasattr(model, "lm_head"):
        embed = model.model.embed_tokens  # Qwen, Llama and most decoder-only models
        if model.lm_head.weight is not embed.weight:
            model.lm_head.tie_weights(embed)
            retied = True
        # The reload skips the head ("Failed to load weights"), so whatever the backend
        # derived from its weight at startup stays stale: the CPU backend's prepacked GEMM
        # still holds the old embedding. Derive it again from the (new) tied weight.
        quant = getattr(model.lm_head, "quant_method", None)
        if quant is not None:
            quant.process_weights_after_loading(model.lm_head)
            repacked = True
    return retied, repacked
