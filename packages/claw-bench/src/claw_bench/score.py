"""Scoring: claw.run/v1 records in, claw.outcome/v1 records out.

Rules:
- A run the sandbox could not carry out (``infra_error``, or ``error``: the job was invalid, e.g.
  the sandbox's own lookup before the agent ran found no harness program in the job's
  environment), or an ok/timeout run without a verify result, is ``status: infra_error`` with
  reward null: never a zero reward, so it neither trains nor counts against Pass@k. Only the
  sandbox decides this, from what it saw: the agent command's exit code never does. Any exit
  code, 126 / 127 included (an agent can exit with them, or make its shell exit with them), is a
  failed rollout its verifier scores, as in Harbor.
- A run planned as not scorable (the oracle of a task without a reference solution) is
  ``status: not_scorable`` with the reason.
- Otherwise the reward is the verifier's reward when it gave one; else the mean of its numeric
  sub-scores (``details``); else 1.0 / 0.0 from its exit code. A verifier that timed out, or gave
  no reward and says why (``details.no_reward``: killed, or its places could not be cleared),
  scores 0 and does not pass; a collected reward file is then never read.
- A multi-step run (Harbor ``steps/``; ``meta.multi_step_reward_strategy``) takes its reward from
  its steps by Harbor's rule: ``mean`` (per-key mean over the verified steps) or ``final`` (the
  last step's); see :func:`aggregate_steps`.
- ``passed`` is ``reward >= threshold`` when a threshold applies (the ``threshold`` argument,
  else the task's ``pass_threshold`` carried in the job meta); else the verifier's exit code.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from claw_bench.errors import RecordError
from claw_bench.loaders._common import checker_details
from claw_bench.loaders.judge import Judge, apply_judge
from claw_bench.loaders.officeqa import apply_officeqa
from claw_bench.loaders.rubric import apply_rubric_chain
from claw_bench.records import OUTCOME
from claw_bench.reward import parse_reward


def _sub_scores(details: Any) -> dict[str, float]:
    if not isinstance(details, dict):
        return {}
    return {
        k: float(v)
        for k, v in details.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


def _no_reward(verify: dict[str, Any]) -> str | None:
    """Why the sandbox gave the verifier no reward (``details.no_reward``), when it says so."""
    details = verify.get("details")
    why = details.get("no_reward") if isinstance(details, dict) else None
    return why if verify.get("reward") is None and isinstance(why, str) else None


def _reward_from_collected(run: dict[str, Any]) -> tuple[float | None, dict[str, float]]:
    """The verifier's reward file, if the sandbox collected it: a number or a JSON object."""
    for text in (run.get("collected") or {}).values():
        if isinstance(text, str):
            reward, subs = parse_reward(text)
            if reward is not None:
                return reward, subs
    return None, {}


#: the claw.run/v1 fields score_run reads, and so validates (a projection reader: docs/formats.md,
#: Readers); every other field is ignored or copied into outcome.meta unread
RUN_READS = (
    "schema",
    "job_id",
    "status",
    "exit_code",
    "verify.exit_code",
    "verify.passed",
    "verify.reward",
    "verify.details",
    "verify.output",
    "verify.timed_out",
    "collected",
    "error",
    "meta",
    "stdout_tail",
)


def _bad(where: str, field: str, want: str, value: Any) -> RecordError:
    return RecordError(f"{where}: field {field!r} must be {want}, got {value!r:.60}")


def check_run(run: Any, where: str = "run") -> None:
    """Validate the fields of a claw.run/v1 dict that scoring reads (`RUN_READS`); RecordError
    names `where` and the field. Unknown fields and the fields scoring does not read pass."""
    if not isinstance(run, dict):
        raise RecordError(f"{where}: expected a JSON object, got {type(run).__name__}")
    if not isinstance(run.get("job_id"), str) or not run["job_id"]:
        raise _bad(where, "job_id", "a non-empty string", run.get("job_id"))
    code = run.get("exit_code")
    if code is not None and (type(code) is not int):
        raise _bad(where, "exit_code", "an integer or null", code)
    if run.get("error") is not None and not isinstance(run["error"], str):
        raise _bad(where, "error", "a string or null", run["error"])
    if "stdout_tail" in run and not isinstance(run["stdout_tail"], str):
        raise _bad(where, "stdout_tail", "a string", run["stdout_tail"])
    collected = run.get("collected", {})
    if not isinstance(collected, dict) or not all(isinstance(v, str) for v in collected.values()):
        raise _bad(where, "collected", "an object of path -> text", collected)
    verify = run.get("verify")
    if verify is None:
        return
    if not isinstance(verify, dict):
        raise _bad(where, "verify", "an object or null", verify)
    for key, ok, want in (
        ("exit_code", lambda v: v is None or type(v) is int, "an integer or null"),
        ("passed", lambda v: isinstance(v, bool), "a boolean"),
        (
            "reward",
            lambda v: v is None or (type(v) in (int, float) and 0.0 <= v <= 1.0),
            "a number in [0, 1] or null",
        ),
        ("details", lambda v: isinstance(v, dict), "an object"),
        ("output", lambda v: isinstance(v, str), "a string"),
        ("timed_out", lambda v: isinstance(v, bool), "a boolean"),
    ):
        if key in verify and not ok(verify[key]):
            raise _bad(where, f"verify.{key}", want, verify[key])


def _run_meta(run: dict[str, Any], where: str) -> dict[str, Any]:
    """The run's meta, which must name the session, task and harness claw-bench planned."""
    meta = run.get("meta") or {}
    if not isinstance(meta, dict):
        raise RecordError(f"{where}: field 'meta' must be an object")
    for key in ("session", "task", "harness"):
        if not isinstance(meta.get(key), str) or not meta.get(key):
            raise RecordError(
                f"{where}: field 'meta.{key}' is missing (was the job planned by claw-bench plan?)"
            )
    return meta


def _outcome_head(run: dict[str, Any], meta: dict[str, Any], status: str) -> dict[str, Any]:
    """The outcome's identity and run facts, before any scoring (status ok, no reward yet)."""
    out: dict[str, Any] = {
        "schema": OUTCOME,
        "session": meta["session"],
        "task": meta["task"],
        "harness": meta["harness"],
        "group": str(meta.get("group") or meta["task"]),
        "reward": None,
        "passed": None,
        "status": "ok",
    }
    if isinstance(meta.get("sample"), int) and meta["sample"] >= 0:
        out["sample"] = meta["sample"]
    if isinstance(run.get("job_id"), str):
        out["job_id"] = run["job_id"]
    if isinstance(meta.get("policy_version"), int):
        out["policy_version"] = meta["policy_version"]
    out["meta"] = {k: meta[k] for k in ("run_id", "api") if k in meta}
    out["meta"].update(
        {
            "run_status": status,
            "exit_code": run.get("exit_code"),
            "duration_s": run.get("duration_s"),
        }
    )
    return out


def _unscored(run: dict[str, Any], meta: dict[str, Any], status: str) -> tuple[str, str] | None:
    """(status, error) of a run that gets no reward: planned as not scorable, a run the sandbox
    could not carry out (its harness program missing included), a run without a verify result.
    The command's exit code is not looked at: it is the agent's."""
    if isinstance(meta.get("not_scorable"), str):
        return "not_scorable", meta["not_scorable"]
    if status in ("error", "infra_error"):
        return "infra_error", run.get("error") or f"run status {status}"
    if not isinstance(run.get("verify"), dict):
        return "infra_error", run.get("error") or "the run has no verify result"
    return None


def score_run(
    run: dict[str, Any],
    *,
    threshold: float | None = None,
    where: str = "run",
    judge: Judge | None = None,
) -> dict[str, Any]:
    """The claw.outcome/v1 dict of one claw.run/v1 dict (see the module docstring for the rules).

    Runs whose meta carries a ``judge`` rubric (PinchBench llm_judge / hybrid, ClawGym hybrid)
    go through ``judge`` (claw_bench.loaders.judge), criterion by criterion when the rubric is a
    chain of criteria (claw_bench.loaders.rubric): without a judge they are ``not_scorable``.
    The fields read are checked first (`check_run`).
    """
    check_run(run, where)
    meta = _run_meta(run, where)
    status = run.get("status")
    if status not in ("ok", "timeout", "error", "infra_error"):
        raise RecordError(f"{where}: field 'status': unknown value {status!r}")
    out = _outcome_head(run, meta, status)
    unscored = _unscored(run, meta, status)
    if unscored is not None:
        out["status"], out["error"] = unscored
        return out
    if isinstance(run.get("steps"), list) and meta.get("multi_step_reward_strategy") in STRATEGIES:
        return _score_steps(out, run, meta, threshold, where)
    out = _score_verified(out, run, meta, threshold)
    if out["status"] == "ok" and isinstance(meta.get("judge"), dict):
        spec = meta["judge"]
        grade = apply_rubric_chain if "criteria" in spec else apply_judge
        out = grade(out, run, spec, judge, threshold)
    if out["status"] == "ok" and isinstance(meta.get("officeqa"), dict):
        out = apply_officeqa(out, run, meta["officeqa"], threshold)
    return out


def _verifier_reward(
    run: dict[str, Any], verify: dict[str, Any], details: dict[str, Any]
) -> tuple[Any, bool, dict[str, float]]:
    """(reward, passed by exit code, sub-scores) of a verified run: the verifier's reward, else
    its reward file's, else the mean of its sub-scores, else its exit code; 0 and not passed when
    it timed out or gave no reward and says why (both noted in ``details``)."""
    passed_exit = bool(verify.get("passed", verify.get("exit_code") == 0))
    reward = verify.get("reward")
    subs = _sub_scores(verify.get("details"))
    no_reward = _no_reward(verify)
    if verify.get("timed_out") or no_reward is not None:
        if verify.get("timed_out"):
            details["verify_timed_out"] = True
        if no_reward is not None:
            details["no_reward"] = no_reward
        return 0.0, False, subs
    if reward is None:
        reward, file_subs = _reward_from_collected(run)
        subs = subs or file_subs
        if reward is None:
            reward = sum(subs.values()) / len(subs) if subs else (1.0 if passed_exit else 0.0)
    return reward, passed_exit, subs


def _score_verified(
    out: dict[str, Any], run: dict[str, Any], meta: dict[str, Any], threshold: float | None
) -> dict[str, Any]:
    """A single-step run with a verify result: its reward, passed and details."""
    verify = run["verify"]
    details: dict[str, Any] = {}
    reward, passed_exit, subs = _verifier_reward(run, verify, details)
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not 0.0 <= reward <= 1.0:
        out["status"] = "infra_error"
        out["error"] = f"verifier reward {reward!r} is not a number in [0, 1]"
        return out
    details.update(subs)
    details.update(checker_details(run))
    if isinstance(verify.get("output"), str) and verify["output"]:
        details["verify_output"] = verify["output"][-2000:]
    thr = threshold if threshold is not None else meta.get("pass_threshold")
    out["reward"] = float(reward)
    out["passed"] = bool(reward >= thr) if isinstance(thr, int | float) else passed_exit
    if verify.get("timed_out") or _no_reward(verify) is not None:
        out["passed"] = False  # whatever the threshold: the verifier gave no verdict
    if run.get("status") == "timeout":
        details["agent_timed_out"] = True
    out["details"] = details
    return out


#: Harbor's multi-step reward rules (task.toml ``multi_step_reward_strategy``)
STRATEGIES = ("mean", "final")


def step_rewards(verify: dict[str, Any]) -> dict[str, float]:
    """A verified step's named rewards: the reward file's keys when it held an object, else
    {"reward": reward}; a verifier that timed out or gave no reward (``details.no_reward``) gives
    {"reward": 0}."""
    if verify.get("timed_out") or _no_reward(verify) is not None:
        return {"reward": 0.0}
    subs = _sub_scores(verify.get("details"))
    if subs:
        return subs
    reward = verify.get("reward")
    if isinstance(reward, int | float) and not isinstance(reward, bool):
        return {"reward": float(reward)}
    return {"reward": 1.0 if verify.get("passed") else 0.0}


def aggregate_steps(per_step: list[dict[str, float]], strategy: str) -> dict[str, float]:
    """Harbor's trial reward of a multi-step task from its verified steps' rewards, in order:
    ``mean`` is the per-key mean over the steps (a key a step lacks counts 0 for it); ``final`` is
    the last step's, as it is."""
    if not per_step:
        return {}
    if strategy == "final":
        return dict(per_step[-1])
    keys = list(dict.fromkeys(k for r in per_step for k in r))
    return {k: sum(r.get(k, 0.0) for r in per_step) / len(per_step) for k in keys}


def _score_steps(
    out: dict[str, Any],
    run: dict[str, Any],
    meta: dict[str, Any],
    threshold: float | None,
    where: str,
) -> dict[str, Any]:
    """A multi-step run (claw.run/v1 ``steps``): each verified step's rewards, the trial reward by
    the task's strategy (one number: the aggregate's ``reward`` key alone, else its keys' mean),
    ``details.steps`` per step and ``details.stopped_after`` when a min_reward gate ended them."""
    steps = [s for s in run["steps"] if isinstance(s, dict)]
    for i, s in enumerate(steps):
        if s.get("verify") is not None:
            check_run({"job_id": "step", "verify": s["verify"]}, f"{where}: steps[{i}]")
    verified = [(s, step_rewards(s["verify"])) for s in steps if isinstance(s.get("verify"), dict)]
    if not verified:
        out["status"] = "infra_error"
        out["error"] = "no step of the multi-step run was verified"
        return out
    strategy = meta["multi_step_reward_strategy"]
    agg = aggregate_steps([r for _, r in verified], strategy)
    reward = agg["reward"] if set(agg) == {"reward"} else sum(agg.values()) / len(agg)
    details: dict[str, Any] = {k: v for k, v in agg.items() if set(agg) != {"reward"}}
    details["steps"] = [
        {
            "name": s.get("name"),
            "reward": (sum(r.values()) / len(r)) if r else 0.0,
            "rewards": r,
        }
        for s, r in verified
    ]
    details["multi_step_reward_strategy"] = strategy
    gated = [s.get("name") for s in steps if (s.get("min_reward") or {}).get("met") is False]
    if gated:
        details["stopped_after"] = gated[0]
    if any(s.get("status") == "timeout" for s in steps):
        details["agent_timed_out"] = True
    thr = threshold if threshold is not None else meta.get("pass_threshold")
    out["reward"] = float(reward)
    last = verified[-1][0]["verify"]
    out["passed"] = (
        bool(reward >= thr) if isinstance(thr, int | float) else bool(last.get("passed"))
    )
    out["details"] = details
    return out


def score_runs(
    runs: Iterable[dict[str, Any]], *, threshold: float | None = None, judge: Judge | None = None
) -> list[dict[str, Any]]:
    """claw.outcome/v1 dicts for claw.run/v1 dicts, in order; errors name the record's index."""
    return [
        score_run(
            r, threshold=threshold, where=f"run #{i + 1} ({r.get('job_id', '?')})", judge=judge
        )
        for i, r in enumerate(runs)
    ]
