#!/usr/bin/env bash
# GPU checks, each writing one JSON file (rewritten as it goes: a cut-short run still reports).
#
# Default, tree training (issue 18), <= 8 minutes on one H200: tree vs chain merge vs per-call
# update tokens/s at 16K and 64K tree tokens with a random-initialised Qwen3-1.7B-architecture
# model in bf16 (no download, no network). Writes $OUT/gpu_check.json (or the path given as $1).
#
# --loop, the real-loop smoke (issue 28), <= 10 minutes: examples/mix_harness_rl.py for 2 steps
# on claw-toy with a small random-weight Qwen3 made here, vLLM on the GPU (claw worker
# extension) when this Python imports vllm, else claw-proxy's transformers engine ("vllm":
# "missing" in the JSON), the learner on the GPU, one harness (claude-code when installed,
# else claw-agent-text). Per step: rollout, train, save and reload seconds, Pass@1.
# Writes $OUT/gpu_loop_check.json (or the path given after --loop). Arguments after the JSON
# path go to gpu_loop_check.py: `--moe` makes the policy a Qwen3-MoE (16 experts, top-4): vLLM
# returns routed experts (needs vLLM >= 0.22.0, else the transformers engine runs and the JSON
# says why) and the learner replays them (--routing-replay r3).
#
# Needs Python with torch and transformers (as preinstalled there) plus the claw packages'
# small dependencies; the claw packages themselves come from this checkout (PYTHONPATH, with
# package metadata written to a temporary folder). A folder of extra pure-Python dependencies
# can travel along: CLAW_GPU_DEPS [.venvs/gpu-deps], made with e.g.
#   pip install --target .venvs/gpu-deps --python-version 3.12 --only-binary=:all: starlette uvicorn httpx jinja2 pyyaml rich
#
#   bench/gpu_check.sh                  # on the GPU machine: tree training
#   bench/gpu_check.sh --loop           # on the GPU machine: the loop smoke
#   bench/gpu_check.sh --loop --tiny /tmp/gpu_loop_check.json    # CPU dry run of the smoke
#   bench/gpu_check.sh --loop "$OUT/gpu_loop_check.json" --moe  # the smoke with an MoE policy
#   python bench/gpu_check.py --tiny --out /tmp/gpu_check.json   # CPU dry run of tree training
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOOP=0 TINY=0
[ "${1:-}" = --loop ] && { LOOP=1; shift; }
[ "$LOOP" = 1 ] && [ "${1:-}" = --tiny ] && { TINY=1; shift; }
NAME=$([ "$LOOP" = 1 ] && echo gpu_loop_check || echo gpu_check)
OUT_FILE=${1:-${OUT:?set OUT or pass the JSON path}/$NAME.json}

# the five packages from this checkout; importlib.metadata needs their dist-info to find versions
META=$(mktemp -d)
trap 'rm -rf "$META"' EXIT
SRC=""
for pkg in packages/claw-*/; do
  name=$(basename "$pkg")
  version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$pkg/pyproject.toml" | head -1)
  mkdir -p "$META/${name//-/_}-$version.dist-info"
  printf 'Metadata-Version: 2.1\nName: %s\nVersion: %s\n' "$name" "$version" >"$META/${name//-/_}-$version.dist-info/METADATA"
  SRC="$SRC:$PWD/${pkg}src"
done
DEPS=${CLAW_GPU_DEPS:-.venvs/gpu-deps}
[ -d "$DEPS" ] && SRC="$SRC:$(cd "$DEPS" && pwd)"
export PYTHONPATH="${SRC#:}:$META${PYTHONPATH:+:$PYTHONPATH}"
MODULES="torch transformers attrs click numpy safetensors"
[ "$LOOP" = 1 ] && MODULES="$MODULES tokenizers httpx starlette uvicorn jinja2 yaml rich"
for mod in $MODULES; do
  "$PY" -c "import $mod" 2>/dev/null || { echo "$NAME: python module '$mod' is missing (see CLAW_GPU_DEPS above)" >&2; exit 2; }
done
if [ "$TINY" = 0 ]; then
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else '$NAME: no CUDA device')"
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >&2 || true
fi
if [ "$LOOP" = 1 ]; then
  # 570 s of the 10 minutes; the JSON is rewritten after every step
  timeout 570 "$PY" bench/gpu_loop_check.py --out "$OUT_FILE" $([ "$TINY" = 1 ] && echo --tiny) "${@:2}"
else
  # 470 s leaves the rest of the 8 minutes for interpreter start and teardown; the JSON is
  # rewritten after every measurement, so a cut-short run still reports what it measured
  timeout 470 "$PY" bench/gpu_check.py --out "$OUT_FILE" "${@:2}"
fi
echo "$NAME: wrote $OUT_FILE" >&2
