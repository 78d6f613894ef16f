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

It runs inside vLLM's worker processes, so it imports nothing from claw.
"""


class ClawWorkerExtension:
    """Mixed into vLLM's Worker class by `--worker-extension-cls`."""

    def claw_reload_weights(self, weights_path: str) -> dict:
        """reload_weights(weights_path) on this worker, then re-tie the LM head; what was done."""
        self.reload_weights(weights_path=weights_path)
        model = self.model_runner.get_model()
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
        return {
            "weights_path": weights_path,
            "retied_lm_head": retied,
            "repacked_lm_head": repacked,
        }
