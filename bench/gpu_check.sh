#!/usr/bin/env bash
# GPU check for claw-rl tree training (issue 18), sized for <= 8 minutes on one H200:
# tree vs chain merge vs per-call update tokens/s at 16K and 64K tree tokens with a
# random-initialised Qwen3-1.7B-architecture model in bf16 (no download, no network).
# Needs Python with torch and transformers (as preinstalled there) plus claw-rl's own small
# dependencies (attrs, click, numpy, safetensors); claw-rl itself comes from this checkout.
# Writes one JSON file: $OUT/gpu_check.json (or the path given as $1).
#   bench/gpu_check.sh                 # on the GPU machine
#   python bench/gpu_check.py --tiny --out /tmp/gpu_check.json   # CPU dry run of the logic
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT_FILE=${1:-${OUT:?set OUT or pass the JSON path}/gpu_check.json}
export PYTHONPATH="packages/claw-rl/src${PYTHONPATH:+:$PYTHONPATH}"
for mod in torch transformers attrs click numpy safetensors; do
  "$PY" -c "import $mod" 2>/dev/null || { echo "gpu_check: python module '$mod' is missing" >&2; exit 2; }
done
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_check: no CUDA device')"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >&2 || true
# 470 s leaves the rest of the 8 minutes for interpreter start and teardown; the JSON is
# rewritten after every measurement, so a cut-short run still reports what it measured
timeout 470 "$PY" bench/gpu_check.py --out "$OUT_FILE" "${@:2}"
echo "gpu_check: wrote $OUT_FILE" >&2
