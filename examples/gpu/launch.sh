#!/usr/bin/env bash
# The GPU recipe: vLLM serves the policy on GPU, claw-proxy records every call in front of it,
# harnesses run in bwrap (or Docker) sandboxes, the learner trains on the GPU(s), and new
# weights are pushed into vLLM after every step. Each piece is checked before the loop starts.
#
#   MODEL=/models/Qwen3-4B ./examples/gpu/launch.sh --steps 200 --harness claude-code --harness openclaw-chat
#
# Runs unchanged on one GPU box (vLLM and the learner share the GPU: VLLM_MEM caps vLLM's share).
# Environment (defaults in brackets):
#   MODEL         Qwen3-style HF model directory (required)
#   RUN_DIR       run directory, resumable [runs/gpu]
#   VLLM_PY       python of the vLLM venv [.venvs/vllm/bin/python]   CLAW_PY  python with claw [.venvs/workspace/bin/python]
#   VLLM_GPUS     CUDA_VISIBLE_DEVICES for vLLM [0]                   LEARNER_GPUS  ... for the learner [0]
#   VLLM_PORT     [8001]   VLLM_MEM  vLLM --gpu-memory-utilization [0.45]   MAX_LEN  --max-model-len [32768]
#   BACKEND       claw-sandbox backend [bwrap]                        PARALLEL  sandbox jobs at once [32]
# Other arguments go to examples/mix_harness_rl.py.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${MODEL:?set MODEL to a Qwen3-style HF model directory}"
RUN_DIR=${RUN_DIR:-runs/gpu}
VLLM_PY=${VLLM_PY:-.venvs/vllm/bin/python}
CLAW_PY=${CLAW_PY:-.venvs/workspace/bin/python}
VLLM_GPUS=${VLLM_GPUS:-0}
LEARNER_GPUS=${LEARNER_GPUS:-0}
VLLM_PORT=${VLLM_PORT:-8001}
VLLM_MEM=${VLLM_MEM:-0.45}
MAX_LEN=${MAX_LEN:-32768}
BACKEND=${BACKEND:-bwrap}
PARALLEL=${PARALLEL:-32}
mkdir -p "$RUN_DIR"

say() { echo "launch: $*" >&2; }
fail() { say "FAILED: $*"; exit 1; }

# --- checks before anything starts -------------------------------------------------------------
command -v nvidia-smi >/dev/null || fail "nvidia-smi not found: no NVIDIA driver on this machine"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader >&2 || fail "nvidia-smi cannot see a GPU"
[ -f "$MODEL/config.json" ] || fail "$MODEL has no config.json: not an HF model directory"
"$VLLM_PY" -c "import vllm" 2>/dev/null || fail "$VLLM_PY cannot import vllm (pip install vllm into its own venv)"
CUDA_VISIBLE_DEVICES=$LEARNER_GPUS "$CLAW_PY" -c "import torch, claw_rl, claw_proxy, claw_sandbox, claw_bench, claw_tree; assert torch.cuda.is_available(), 'torch sees no GPU'" \
  || fail "$CLAW_PY lacks the claw packages or a CUDA torch (./dev/demo --help builds .venvs/workspace)"
"$CLAW_PY" -m claw_sandbox.cli doctor >&2 || true
"$CLAW_PY" -m claw_sandbox.cli doctor 2>&1 | grep -q "^ok  $BACKEND" || fail "sandbox backend $BACKEND does not work here (see doctor above)"

# --- vLLM --------------------------------------------------------------------------------------
# Dev mode exposes the weight-reload routes claw-proxy's vllm engine uses after every step
# (pause, collective_rpc, reset_prefix_cache, update_weight_version, resume). The worker
# extension in this folder reloads from an HF directory and re-ties tied embeddings, which
# vLLM's own reload_weights leaves on the old weights (Qwen3 0.6B-4B tie them). Processed
# logprobs (after temperature / top_k / top_p) are the sampled distribution's, which claw-proxy
# records; under its default --sampling force they equal the raw ones, --sampling honor needs them.
say "starting vLLM on GPU(s) $VLLM_GPUS, port $VLLM_PORT"
CUDA_VISIBLE_DEVICES=$VLLM_GPUS VLLM_SERVER_DEV_MODE=1 PYTHONPATH="$PWD/examples/gpu${PYTHONPATH:+:$PYTHONPATH}" \
  "$VLLM_PY" -m vllm.entrypoints.openai.api_server --worker-extension-cls claw_vllm_worker.ClawWorkerExtension \
  --model "$MODEL" --port "$VLLM_PORT" --host 127.0.0.1 --gpu-memory-utilization "$VLLM_MEM" \
  --max-model-len "$MAX_LEN" --enable-prefix-caching --logprobs-mode processed_logprobs >"$RUN_DIR/vllm.log" 2>&1 &
VLLM_PID=$!
trap 'say "stopping vLLM"; kill $VLLM_PID 2>/dev/null; wait $VLLM_PID 2>/dev/null' EXIT
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$VLLM_PORT/health" >/dev/null && break
  kill -0 $VLLM_PID 2>/dev/null || fail "vLLM exited; see $RUN_DIR/vllm.log"
  sleep 1
done
curl -sf "http://127.0.0.1:$VLLM_PORT/health" >/dev/null || fail "vLLM not healthy after 600 s; see $RUN_DIR/vllm.log"
curl -sf "http://127.0.0.1:$VLLM_PORT/v1/completions" -H 'content-type: application/json' \
  -d "{\"model\": \"$MODEL\", \"prompt\": [1, 2, 3], \"max_tokens\": 2, \"logprobs\": 0, \"return_token_ids\": true}" \
  | grep -q token_ids || fail "vLLM does not answer token-id prompts with token ids (needs return_token_ids)"
say "vLLM healthy"

# --- the loop ----------------------------------------------------------------------------------
say "starting the RL loop in $RUN_DIR"
CUDA_VISIBLE_DEVICES=$LEARNER_GPUS "$CLAW_PY" examples/mix_harness_rl.py --run-dir "$RUN_DIR" --model "$MODEL" \
  --engine "vllm:http://127.0.0.1:$VLLM_PORT" --tokenizer "$MODEL" --backend "$BACKEND" --parallel "$PARALLEL" \
  --max-new-tokens 4096 --lr 1e-6 --epochs 1 --minibatches 4 "$@"
