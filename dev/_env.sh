# Shared by dev/test and dev/demo: make a virtual environment holding chosen packages.
# Only Python 3.11+ and pip are assumed. torch is pinned first (TORCH_SPEC) so that the
# packages' `torch>=2.4` is already met and pip does not pick a different build.
PY=${PYTHON:-python3}
VENVS=${CLAW_VENVS:-.venvs}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

# make_venv NAME [pip install args...]: create (or reuse) $VENVS/NAME and install into it.
make_venv() {
  local name=$1; shift
  local dir="$VENVS/$name"
  if [ ! -x "$dir/bin/python" ]; then
    "$PY" -m venv "$dir"
    "$dir/bin/python" -m pip install -q --disable-pip-version-check -U "pip>=25.1"
  fi
  "$dir/bin/python" -m pip install -q --disable-pip-version-check "$@" 2> >(grep -v "is ignored: it is neither" >&2)
}

# The environment holding all five packages (examples, workspace tests, the demo); Ray, W&B and
# peft for the loop's --executor ray, --wandb and --lora-rank tests; the docker SDK so that
# claw-bench's Harbor-on-docker tests (marked other_clis) run here instead of skipping.
make_workspace_venv() {
  make_venv workspace "$TORCH_SPEC" --group test \
    -e packages/claw-tree -e "packages/claw-sandbox[ray,docker]" -e "packages/claw-proxy[transformers,lora]" \
    -e "packages/claw-rl[wandb,lora]" -e "packages/claw-bench[plot]"
}
