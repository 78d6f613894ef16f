#!/usr/bin/env bash
# One RL step through the five CLIs only, with JSONL files between the steps:
#
#   proxy up -> plan -> run -> score -> samples -> train -> reload
#
# Plug in your own tasks (a directory of task dirs, or any suite claw-bench reads) and your own
# harness (an adapter .toml: packages/claw-bench/README.md, "Harness adapters"). The harness only
# has to send its model calls to OPENAI_BASE_URL / ANTHROPIC_BASE_URL with the key it is given.
#
#   examples/rl_step.sh --suite my-tasks/ --harness my-agent.toml --model runs/tiny \
#       --run-dir runs/step --rollouts 4
#
# (runs/tiny: `claw-rl init-tiny runs/tiny`.) tests/test_rl_step.py runs this on a task and a
# harness adapter written only for that test (tests/fixtures/rl-step/).
#
# Run directory: secret, admin-token, calls.jsonl (claw.call/v1, written by the proxy),
# jobs.jsonl (claw.job/v1), runs.jsonl (claw.run/v1), outcomes.jsonl (claw.outcome/v1),
# samples.jsonl (claw.sample/v1), rl/ (claw-rl's run directory: policy/v1, metrics.jsonl,
# policies.jsonl), policy.jsonl (the new claw.policy/v1), reload.json and stats.json (the
# proxy's answers after loading the new policy), proxy.log.
set -euo pipefail

usage() {
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
    cat <<'EOF'
Options (defaults in brackets):
  --suite SUITE       claw-bench suite: built-in name or directory of tasks   [claw-toy]
  --task ID           only this task (repeatable)
  --harness H         adapter name or .toml path                                [claw-agent-text]
  --model DIR         HF model directory the step starts from                   [required]
  --run-dir DIR       where every file of the step goes                         [runs/step]
  --rollouts N        rollouts per (task, harness): a GRPO group                 [4]
  --algo grpo|ppo     claw-rl learner (ppo: the critic's values go through
                      claw-rl values and claw-tree samples --values)            [grpo]
  --lr LR             learning rate                                              [1e-3]
  --max-new-tokens N  proxy cap on tokens per model call                        [24]
  --backend B         claw-sandbox backend: auto, bwrap, docker, process        [auto]
  --port P            proxy port on 127.0.0.1                                   [8765]
  --seed S            proxy sampling seed and learner seed                      [0]
EOF
}

suite=claw-toy harness=claw-agent-text model="" run=runs/step rollouts=4 algo=grpo lr=1e-3
max_new=24 backend=auto port=8765 seed=0 tasks=()
while (($#)); do
    case "$1" in
        --suite) suite=$2 ;;
        --task) tasks+=(--task "$2") ;;
        --harness) harness=$2 ;;
        --model) model=$2 ;;
        --run-dir) run=$2 ;;
        --rollouts) rollouts=$2 ;;
        --algo) algo=$2 ;;
        --lr) lr=$2 ;;
        --max-new-tokens) max_new=$2 ;;
        --backend) backend=$2 ;;
        --port) port=$2 ;;
        --seed) seed=$2 ;;
        -h | --help) usage; exit 0 ;;
        *) echo "rl_step.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift 2 || { echo "rl_step.sh: $1 needs a value" >&2; exit 2; }
done
[[ -n $model ]] || { echo "rl_step.sh: --model DIR is required (claw-rl init-tiny DIR makes one)" >&2; exit 2; }
[[ -f $model/config.json ]] || { echo "rl_step.sh: --model $model: no config.json there" >&2; exit 2; }
case $algo in grpo | ppo) ;; *) echo "rl_step.sh: --algo must be grpo or ppo, got $algo" >&2; exit 2 ;; esac

mkdir -p "$run"
run=$(cd "$run" && pwd)
model=$(cd "$model" && pwd)
url=http://127.0.0.1:$port
log() { echo "rl_step: $*" >&2; }
for name in secret admin-token; do  # proxy credentials: session tokens are HMAC-signed with secret
    [[ -s $run/$name ]] || od -An -N16 -tx1 /dev/urandom | tr -d ' \n' >"$run/$name"
done
export CLAW_PROXY_URL=$url CLAW_PROXY_ADMIN_TOKEN_FILE=$run/admin-token  # for claw-proxy admin

# --- proxy up: serves the start policy as version 0 and records every call ----------------------
claw-proxy serve --engine "transformers:$model" --port "$port" --seed "$seed" \
    --secret-file "$run/secret" --admin-token-file "$run/admin-token" --record "$run/calls.jsonl" \
    --max-tokens-cap "$max_new" --default-max-tokens "$max_new" 2>"$run/proxy.log" &
proxy=$!
trap 'kill "$proxy" 2>/dev/null; wait "$proxy" 2>/dev/null || true' EXIT
up=0
for _ in $(seq 300); do  # up once its admin API answers
    claw-proxy admin stats >/dev/null 2>&1 && { up=1; break; }
    kill -0 "$proxy" 2>/dev/null || { cat "$run/proxy.log" >&2; exit 1; }
    sleep 0.5
done
((up)) || { log "the proxy did not come up on $url (see $run/proxy.log)"; exit 1; }
log "proxy up on $url, serving $model"

# --- plan -> run -> score: one claw.job/v1 per rollout, sandboxed, verified -----------------------
claw-bench plan --suite "$suite" "${tasks[@]}" --harness "$harness" -n "$rollouts" \
    --proxy "$url" --proxy-secret-file "$run/secret" --run-id "step0-seed$seed" -o "$run/jobs.jsonl"
claw-sandbox run "$run/jobs.jsonl" -o "$run/runs.jsonl" --backend "$backend"
claw-bench score "$run/runs.jsonl" -o "$run/outcomes.jsonl"
log "$(wc -l <"$run/outcomes.jsonl") outcomes, $(wc -l <"$run/calls.jsonl") calls recorded"

# --- samples -> train: tree-packed samples with advantages, one learner step ---------------------
train=(--algo "$algo" --model "$model" -o "$run/rl" --lr "$lr" --seed "$seed")
if [[ $algo == ppo ]]; then  # GAE on the tree needs the critic's values of these very samples
    claw-tree samples "$run/calls.jsonl" "$run/outcomes.jsonl" --algo ppo -o "$run/samples-novalues.jsonl"
    claw-rl values --model "$model" --samples "$run/samples-novalues.jsonl" -o "$run/values.jsonl"
    claw-tree samples "$run/calls.jsonl" "$run/outcomes.jsonl" --algo ppo \
        --values "$run/values.jsonl" -o "$run/samples.jsonl"
else
    claw-tree samples "$run/calls.jsonl" "$run/outcomes.jsonl" --algo grpo -o "$run/samples.jsonl"
fi
claw-rl train "${train[@]}" --samples "$run/samples.jsonl" >"$run/policy.jsonl"
log "trained: $(cat "$run/policy.jsonl")"

# --- reload: the proxy serves the new policy to the next step's rollouts -------------------------
claw-proxy admin reload "$run/policy.jsonl" >"$run/reload.json"
claw-proxy admin stats >"$run/stats.json"
log "reloaded: $(cat "$run/reload.json")"
