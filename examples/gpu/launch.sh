#!/usr/bin/env bash
# The GPU recipe: vLLM serves the policy on GPU, claw-proxy records every call in front of it,
# harnesses run in bwrap (or Docker) sandboxes, the learner trains on the GPU(s), and new
# weights are pushed into vLLM after every step. Each piece is checked before the loop starts.
#
#   MODEL=/models/Qwen3-4B ./examples/gpu/launch.sh --steps 200 --harness claude-code --harness openclaw-chat
#
# Issue 28's recipe, a Qwen3 checkpoint trained through the real Claude Code and OpenClaw on
# ClawGym-Bench (the harnesses from ./dev/install-harnesses, in .tools/bin; no SFT warm start:
# a Qwen3 model already calls tools), batch packing (the harnesses' shared prompts once per
# step's batch):
#
#   MODEL=/models/Qwen3-4B SUITE=/data/ClawGym-Bench HARNESSES="claude-code openclaw-chat" \
#     ./examples/gpu/launch.sh --steps 200 --tasks-per-step 16 --rollouts 8
#
#   DRY_RUN=1 MODEL=... SUITE=... HARNESSES=... ./examples/gpu/launch.sh ...   # on any machine:
#     checks the inputs (model dir, suite, harness binaries), reports the GPU checks that would
#     fail here, prints the exact vLLM and loop commands, starts nothing
#
# Runs unchanged on one GPU box (vLLM and the learner share the GPU: VLLM_MEM caps vLLM's share).
# ENGINE_SLEEP=1 on one GPU box: vLLM starts with --enable-sleep-mode and the loop with
# --engine-sleep, so vLLM frees the GPU while the learner trains (level 1: weights offloaded to
# CPU memory, KV cache freed; level 2 with --weights memory: both freed) and wakes with the new
# weights; calls that come meanwhile wait. vLLM then gets a larger share (VLLM_MEM 0.60): the
# learner's activations use vLLM's memory while it sleeps; its weights, gradients and AdamW
# moments (16 B a parameter, preflight prints them) stay beside vLLM and must fit in the rest.
#
# A mixture-of-experts checkpoint (config.json: num_experts / num_local_experts / n_routed_experts
# > 0, e.g. Qwen3-30B-A3B) is detected by preflight.py, which prints its experts, top-k, MoE
# layers and routing bytes, and refuses a vLLM older than 0.22.0 (the first whose OpenAI server
# returns routed experts). Then vLLM starts with --enable-return-routed-experts (claw-proxy
# records each call's experts), the learner with --routing-replay r3 (its forward uses them),
# and over several vLLM GPUs with --tensor-parallel-size N --enable-expert-parallel: attention
# split N ways as usual, but each GPU holds E/N whole experts (Qwen3-30B-A3B: 128/N) instead of
# a 1/N slice of every expert, so a token's top-k experts run whole where they live (one
# all-to-all each way) rather than all N GPUs computing every expert's slice. A dense model's
# commands are unchanged.
# Environment (defaults in brackets):
#   MODEL         Qwen3-style HF model directory (required)
#   SUITE         claw-bench suite: a name or a task directory / ClawGym JSONL [the loop's default]
#   HARNESSES     harnesses, space-separated, each passed as --harness [the loop's default]
#   DRY_RUN       1: check and print, start nothing [0]
#   RUN_DIR       run directory, resumable [runs/gpu]
#   VLLM_PY       python of the vLLM venv [.venvs/vllm/bin/python]   CLAW_PY  python with claw [.venvs/workspace/bin/python]
#   VLLM_GPUS     CUDA_VISIBLE_DEVICES for vLLM [0]                   LEARNER_GPUS  ... for the learner [0]
#   VLLM_TP       MoE only: vLLM's tensor (and expert) parallel size [the number of VLLM_GPUS]
#   VLLM_PORT     [8001]   VLLM_MEM  vLLM --gpu-memory-utilization [0.45; ENGINE_SLEEP=1: 0.60]
#   MAX_LEN       --max-model-len [32768]
#   ENGINE_SLEEP  1: one GPU box, vLLM sleeps while the learner trains (see above) [0]
#   BACKEND       claw-sandbox backend [bwrap]                        PARALLEL  sandbox jobs at once [32]
#   CLAW_TOOLS    where ./dev/install-harnesses put the harnesses [.tools]
# Other arguments go to examples/mix_harness_rl.py (after launch.sh's own, so they win).
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${MODEL:?set MODEL to a Qwen3-style HF model directory}"
SUITE=${SUITE:-}
HARNESSES=${HARNESSES:-}
DRY_RUN=${DRY_RUN:-0}
RUN_DIR=${RUN_DIR:-runs/gpu}
VLLM_PY=${VLLM_PY:-.venvs/vllm/bin/python}
CLAW_PY=${CLAW_PY:-.venvs/workspace/bin/python}
VLLM_GPUS=${VLLM_GPUS:-0}
LEARNER_GPUS=${LEARNER_GPUS:-0}
VLLM_PORT=${VLLM_PORT:-8001}
ENGINE_SLEEP=${ENGINE_SLEEP:-0}
case "$ENGINE_SLEEP" in 0) VLLM_MEM=${VLLM_MEM:-0.45} ;; 1) VLLM_MEM=${VLLM_MEM:-0.60} ;;
  *) echo "launch: FAILED: ENGINE_SLEEP=$ENGINE_SLEEP: expected 0 or 1" >&2; exit 1 ;; esac
MAX_LEN=${MAX_LEN:-32768}
BACKEND=${BACKEND:-bwrap}
PARALLEL=${PARALLEL:-32}
TOOLS=${CLAW_TOOLS:-$PWD/.tools}

say() { echo "launch: $*" >&2; }
fail() { say "FAILED: $*"; exit 1; }
[ "$ENGINE_SLEEP" = 0 ] || [ "$VLLM_GPUS" = "$LEARNER_GPUS" ] \
  || fail "ENGINE_SLEEP=1 is for vLLM and the learner on the same GPU(s): VLLM_GPUS=$VLLM_GPUS, LEARNER_GPUS=$LEARNER_GPUS"
# a check that needs the GPU machine: fatal there, reported (and survived) by a dry run
gpu_need() { if [ "$DRY_RUN" = 1 ]; then say "dry run: would fail here: $*"; else fail "$*"; fi; }

# The harnesses (./dev/install-harnesses: .tools/bin) and the claw CLIs on PATH; the checkout
# visible read-only inside bwrap, where the harnesses' installs live.
export PATH="$TOOLS/bin:$(dirname "$CLAW_PY"):$PATH"
export CLAW_SANDBOX_RO_PATHS="$PWD${CLAW_SANDBOX_RO_PATHS:+:$CLAW_SANDBOX_RO_PATHS}"

# --- the commands ------------------------------------------------------------------------------
# Dev mode exposes the weight-reload routes claw-proxy's vllm engine uses after every step
# (pause, collective_rpc, reset_prefix_cache, update_weight_version, resume). The worker
# extension in this folder reloads from an HF directory and re-ties tied embeddings, which
# vLLM's own reload_weights leaves on the old weights (Qwen3 0.6B-4B tie them). Processed
# logprobs (after temperature / top_k / top_p) are the sampled distribution's, which claw-proxy
# records; under its default --sampling force they equal the raw ones, --sampling honor needs them.
VLLM_ENV=(CUDA_VISIBLE_DEVICES="$VLLM_GPUS" VLLM_SERVER_DEV_MODE=1 PYTHONPATH="$PWD/examples/gpu${PYTHONPATH:+:$PYTHONPATH}")
# the policy flags (worker extension, prefix caching, processed logprobs) live in
# vllm-policy.args, which the CPU tests (tests/harness/_vllm.py) start vLLM with too
[ -f examples/gpu/vllm-policy.args ] || fail "examples/gpu/vllm-policy.args is missing (vLLM's policy flags)"
mapfile -t POLICY_FLAGS < <(grep -v '^#' examples/gpu/vllm-policy.args)
VLLM_CMD=("$VLLM_PY" -m vllm.entrypoints.openai.api_server "${POLICY_FLAGS[@]}"
  --model "$MODEL" --port "$VLLM_PORT" --host 127.0.0.1 --gpu-memory-utilization "$VLLM_MEM"
  --max-model-len "$MAX_LEN")

# --- checks before anything starts -------------------------------------------------------------
[ -f "$MODEL/config.json" ] || fail "$MODEL has no config.json: not an HF model directory"
[ -f "$MODEL/tokenizer.json" ] || [ -f "$MODEL/tokenizer_config.json" ] \
  || fail "$MODEL has no tokenizer (tokenizer.json / tokenizer_config.json): the proxy renders with it"
say "model $MODEL: $(sed -n 's/.*"model_type": *"\([^"]*\)".*/\1/p' "$MODEL/config.json" | head -1)"
"$CLAW_PY" -c "import claw_rl, claw_proxy, claw_sandbox, claw_bench, claw_tree" \
  || fail "$CLAW_PY lacks the claw packages (./dev/demo --help builds .venvs/workspace)"
# the suite loads (ClawGym-Bench: a folder of task dirs or its JSONL) and every harness's
# binaries are on PATH
PREFLIGHT=()
for h in ${HARNESSES:-claw-agent-text claw-agent-text-anthropic}; do PREFLIGHT+=(--harness "$h"); done
# the model: dense or MoE (prints its experts and routing bytes; an MoE needs vLLM >= 0.22.0)
VLLM_VERSION=$("$VLLM_PY" -c "import vllm; print(vllm.__version__)" 2>/dev/null || true)
MODEL_KIND=$("$CLAW_PY" examples/gpu/preflight.py --suite "${SUITE:-claw-toy}" "${PREFLIGHT[@]}" \
  --model "$MODEL" --vllm-version "$VLLM_VERSION") \
  || fail "inputs missing or refused (above); harness binaries come from ./dev/install-harnesses (CLAW_TOOLS=$TOOLS)"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader >&2 || gpu_need "nvidia-smi cannot see a GPU"
else
  gpu_need "nvidia-smi not found: no NVIDIA driver on this machine"
fi
[ -n "$VLLM_VERSION" ] || gpu_need "$VLLM_PY cannot import vllm (pip install vllm into its own venv)"
CUDA_VISIBLE_DEVICES=$LEARNER_GPUS "$CLAW_PY" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null \
  || gpu_need "$CLAW_PY's torch sees no GPU (a CUDA build of torch is needed)"
DOCTOR=$("$CLAW_PY" -m claw_sandbox doctor 2>&1 || true)
grep -q "^ok  $BACKEND " <<<"$DOCTOR" || gpu_need "sandbox backend $BACKEND does not work here ($CLAW_PY -m claw_sandbox doctor)"

# an MoE policy: vLLM returns each call's routed experts, the learner replays them (R3); over
# several GPUs its experts are spread whole (expert parallel), see the top of this file
LOOP_ARGS=()
if [ "$MODEL_KIND" = moe ]; then
  VLLM_CMD+=(--enable-return-routed-experts)
  IFS=, read -ra GPU_LIST <<<"$VLLM_GPUS"
  VLLM_TP=${VLLM_TP:-${#GPU_LIST[@]}}
  [[ "$VLLM_TP" =~ ^[1-9][0-9]*$ ]] || fail "VLLM_TP=$VLLM_TP: not a positive integer"
  [ "$VLLM_TP" -gt 1 ] && VLLM_CMD+=(--tensor-parallel-size "$VLLM_TP" --enable-expert-parallel)
  LOOP_ARGS+=(--routing-replay r3)
fi
# one GPU box: vLLM frees the GPU while the learner trains (sleep mode: CUDA / ROCm only; its
# /sleep and /wake_up routes are dev-mode routes, VLLM_SERVER_DEV_MODE=1 above)
if [ "$ENGINE_SLEEP" = 1 ]; then
  VLLM_CMD+=(--enable-sleep-mode)
  LOOP_ARGS+=(--engine-sleep)
  say "engine sleep: vLLM sleeps while the learner trains (level 1; level 2 with --weights memory) and wakes with the new weights; VLLM_MEM $VLLM_MEM of GPU $VLLM_GPUS for vLLM while it serves, the learner's weights, gradients and AdamW moments beside it, its activations in vLLM's share while it sleeps"
fi
[ -n "$SUITE" ] && LOOP_ARGS+=(--suite "$SUITE")
for h in $HARNESSES; do LOOP_ARGS+=(--harness "$h"); done
LOOP_CMD=("$CLAW_PY" examples/mix_harness_rl.py --run-dir "$RUN_DIR" --model "$MODEL"
  --engine "vllm:http://127.0.0.1:$VLLM_PORT" --tokenizer "$MODEL" --backend "$BACKEND" --parallel "$PARALLEL"
  --max-new-tokens 4096 --lr 1e-6 --epochs 1 --minibatches 4 --pack batch "${LOOP_ARGS[@]}" "$@")

if [ "$DRY_RUN" = 1 ]; then
  say "dry run: the commands (nothing started)"
  echo "# vLLM (log: $RUN_DIR/vllm.log)"
  printf '%q ' env "${VLLM_ENV[@]}" "${VLLM_CMD[@]}"; echo
  echo "# the RL loop, once vLLM answers on /health"
  printf '%q ' env CUDA_VISIBLE_DEVICES="$LEARNER_GPUS" "${LOOP_CMD[@]}"; echo
  exit 0
fi
mkdir -p "$RUN_DIR"

# --- vLLM --------------------------------------------------------------------------------------
say "starting vLLM on GPU(s) $VLLM_GPUS, port $VLLM_PORT"
env "${VLLM_ENV[@]}" "${VLLM_CMD[@]}" >"$RUN_DIR/vllm.log" 2>&1 &
VLLM_PID=$!
trap 'say "stopping vLLM"; kill $VLLM_PID 2>/dev/null; wait $VLLM_PID 2>/dev/null' EXIT
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$VLLM_PORT/health" >/dev/null && break
  kill -0 $VLLM_PID 2>/dev/null || fail "vLLM exited; see $RUN_DIR/vllm.log"
  sleep 1
done
curl -sf "http://127.0.0.1:$VLLM_PORT/health" >/dev/null || fail "vLLM not healthy after 600 s; see $RUN_DIR/vllm.log"
PROBE=$(curl -sf "http://127.0.0.1:$VLLM_PORT/v1/completions" -H 'content-type: application/json' \
  -d "{\"model\": \"$MODEL\", \"prompt\": [1, 2, 3], \"max_tokens\": 2, \"logprobs\": 0, \"return_token_ids\": true}" || true)
grep -q token_ids <<<"$PROBE" || fail "vLLM does not answer token-id prompts with token ids (needs return_token_ids)"
[ "$MODEL_KIND" != moe ] || grep -q '"routed_experts"' <<<"$PROBE" \
  || fail "vLLM $VLLM_VERSION started with --enable-return-routed-experts answers without routed_experts"
say "vLLM healthy"

# --- the loop ----------------------------------------------------------------------------------
say "starting the RL loop in $RUN_DIR"
env CUDA_VISIBLE_DEVICES="$LEARNER_GPUS" "${LOOP_CMD[@]}"
