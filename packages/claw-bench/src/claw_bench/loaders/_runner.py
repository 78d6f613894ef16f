"""Verifier runner shipped (as text) with every task a public-suite loader produces.

It runs inside the sandbox after the agent finished, with the final workspace as its working
directory and its own files under ``$CLAW_VERIFY_DIR`` (``.claw_verify/``). Standard library
only; it never imports claw_bench. Its config is ``$CLAW_VERIFY_DIR/runner.json``::

    {"kind": "clawgym" | "pinchbench", "timeout_s": 120, "threshold": 1.0, ...}

It runs the task's own checker in a new process group, kills the group at ``timeout_s``, and
turns whatever the checker did into a reward in [0, 1]:

- clawgym: moves ``.claw_verify/reward/`` to ``reward/`` (the folder the checker expects, never
  visible to the agent), rewrites the task's mount dir to the real workspace path, runs the
  entry command; the reward is the LAST non-empty stdout line (a float in [0, 1]); a JSON object
  line of 0/1 values printed before it gives the named sub-scores.
- pinchbench: calls ``grade(transcript, workspace_path)`` from the task's Markdown; the
  automated score is the mean of the returned dict's values.
(Harbor tasks get a bash runner instead, see harbor_tb.py: their images need not have Python.)

A checker that exits non-zero, prints garbage or hangs scores 0, and the reason is recorded.
Results: the reward (a plain number) in ``$CLAW_REWARD_FILE``; ``$CLAW_VERIFY_DIR/details.json``
holds {"scores", "reason", "checker_exit_code", "checker_timed_out", "automated_score"}.
Exit code 0 when reward >= threshold, else 1.
"""

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time

VDIR = os.environ.get("CLAW_VERIFY_DIR", ".claw_verify")
REWARD_FILE = os.environ.get("CLAW_REWARD_FILE", os.path.join(VDIR, "reward.json"))
GRADE_DRIVER = r"""
import json, sys, importlib.util
spec = importlib.util.spec_from_file_location("claw_task_grade", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
with open(sys.argv[2], encoding="utf-8") as fh:
    transcript = json.load(fh)
result = mod.grade(transcript, sys.argv[3])
print("CLAW_GRADE_RESULT " + json.dumps(result, default=repr))
"""


def unit(value):
    """value as a float in [0, 1], or None."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value) and 0.0 <= value <= 1.0:
        return float(value)
    return None


def run(argv, timeout_s, env=None):
    """(exit code or None when killed at the timeout, stdout, stderr) of argv in its own group."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
        env=env,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err


def scores_of(obj, where):
    """Named sub-scores of a checker's dict; raises ValueError naming the bad key."""
    if not isinstance(obj, dict) or not obj:
        raise ValueError(
            f"{where} returned {type(obj).__name__} {str(obj)[:80]!r}, expected a non-empty dict"
        )
    scores = {}
    for k, v in obj.items():
        u = unit(v)
        if u is None:
            raise ValueError(f"{where}: score {k!r} = {v!r} is not a number in [0, 1]")
        scores[str(k)] = u
    return scores


def remap(root, old, new):
    """Replace the task's mount dir by the workspace path in every text file under root."""
    for dirpath, _, names in os.walk(root):
        for name in names:
            p = os.path.join(dirpath, name)
            try:
                with open(p, encoding="utf-8") as fh:
                    text = fh.read()
            except (UnicodeDecodeError, OSError):
                continue
            if old in text:
                with open(p, "w", encoding="utf-8") as fh:
                    fh.write(text.replace(old, new))


def clawgym(cfg, ws, res):
    src, dst = os.path.join(VDIR, "reward"), os.path.join(ws, "reward")
    if os.path.lexists(dst):
        if os.path.isdir(dst) and not os.path.islink(dst):
            shutil.rmtree(dst)
        else:
            os.remove(dst)
    shutil.copytree(src, dst)
    workspace = cfg.get("workspace_dir") or ws
    mount = cfg.get("mount_dir")
    if mount and mount != workspace:
        remap(dst, mount.rstrip("/"), workspace.rstrip("/"))
    if cfg.get("grade_file"):  # a checker with grade(transcript, workspace_path) and no entry point
        return call_grade(
            cfg, os.path.join(ws, cfg["grade_file"]), empty_transcript(), workspace, res, dst
        )
    command = cfg["command"]
    if mount and mount != workspace:
        command = command.replace(mount.rstrip("/"), workspace.rstrip("/"))
    try:
        code, out, err = run(["bash", "-c", command], cfg["timeout_s"])
    finally:
        shutil.rmtree(dst, ignore_errors=True)
    res.update(
        checker_exit_code=code, checker_timed_out=code is None, checker_output=(out + err)[-2000:]
    )
    if code is None:
        raise ValueError(f"checker killed at its timeout ({cfg['timeout_s']:g}s)")
    if code != 0:
        raise ValueError(f"checker exited with code {code}: {(err or out).strip()[-300:]}")
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    if not lines:
        raise ValueError(
            "checker printed nothing (the last stdout line must be a reward in [0, 1])"
        )
    for ln in lines:
        if ln.startswith("{"):
            with contextlib.suppress(ValueError):  # not a dict of sub-scores: the last line decides
                res["scores"] = scores_of(json.loads(ln), "checker")
    try:
        value = float(lines[-1])
    except ValueError:
        value = None
    if value is None or unit(value) is None:
        if lines[-1].startswith("{") and res.get("scores"):
            return sum(res["scores"].values()) / len(res["scores"])
        raise ValueError(f"last stdout line is not a reward in [0, 1]: {lines[-1][:80]!r}")
    return value


def empty_transcript():
    path = os.path.join(VDIR, "empty_transcript.json")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("[]")
    return path


def pinchbench(cfg, ws, res):
    transcript = os.environ.get("CLAW_TRANSCRIPT_FILE") or os.path.join(VDIR, "transcript.json")
    if not os.path.isfile(transcript):
        transcript = empty_transcript()
    res["transcript"] = os.path.basename(transcript) if "empty" not in transcript else "empty"
    return call_grade(
        cfg, os.path.join(VDIR, "grade.py"), transcript, cfg.get("workspace_dir") or ws, res
    )


def call_grade(cfg, grade_file, transcript, workspace, res, cleanup=None):
    """Run grade(transcript, workspace) from grade_file in a fresh interpreter; the mean of its dict."""
    argv = [sys.executable, "-I", "-c", GRADE_DRIVER, grade_file, transcript, workspace]
    try:
        code, out, err = run(argv, cfg["timeout_s"])
    finally:
        if cleanup:
            shutil.rmtree(cleanup, ignore_errors=True)
    res.update(
        checker_exit_code=code, checker_timed_out=code is None, checker_output=(out + err)[-2000:]
    )
    if code is None:
        raise ValueError(f"grade() killed at its timeout ({cfg['timeout_s']:g}s)")
    if code != 0:
        raise ValueError(f"grade() crashed (exit {code}): {err.strip()[-300:]}")
    line = [ln for ln in out.splitlines() if ln.startswith("CLAW_GRADE_RESULT ")]
    if not line:
        raise ValueError("grade() returned nothing")
    res["scores"] = scores_of(json.loads(line[-1].split(" ", 1)[1]), "grade()")
    return sum(res["scores"].values()) / len(res["scores"])


def snapshot(ws, path, limit=600_000, per_file=100_000):
    """The agent's text files (for the LLM judge) as one JSON object {path: text}, within ``limit`` chars."""
    files, total = {}, 0
    skip = (".claw_verify", ".claw_harness", ".claw_setup", "reward")
    for dirpath, dirnames, names in os.walk(ws):
        rel_dir = os.path.relpath(dirpath, ws)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d not in skip]
        dirnames.sort()
        for name in sorted(names):
            rel = os.path.normpath(os.path.join(rel_dir, name)).replace(os.sep, "/")
            try:
                with open(os.path.join(dirpath, name), encoding="utf-8") as fh:
                    text = fh.read(per_file + 1)
            except (UnicodeDecodeError, OSError):
                continue
            if len(text) > per_file:
                text = text[:per_file] + "\n[... cut]"
            if total + len(text) > limit:
                files["[left out]"] = "more files: the snapshot is full"
                break
            files[rel] = text
            total += len(text)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(files, fh)


def none(cfg, ws, res):
    """Judge-only tasks: no automated checker; ``claw-bench score`` asks the judge."""
    res["automated_score"] = None
    return 0.0


def main():
    with open(os.path.join(VDIR, "runner.json"), encoding="utf-8") as fh:
        cfg = json.load(fh)
    ws = os.getcwd()
    res: dict = {"scores": {}, "reason": None}
    started = time.monotonic()
    try:
        reward = {"clawgym": clawgym, "pinchbench": pinchbench, "none": none}[cfg["kind"]](
            cfg, ws, res
        )
    except Exception as exc:  # noqa: BLE001 - every checker failure is a zero reward with its reason
        reward = 0.0
        res["reason"] = (
            f"{type(exc).__name__}: {exc}" if not isinstance(exc, ValueError) else str(exc)
        )
    res.setdefault("automated_score", reward)
    if cfg.get("judge_files"):
        snapshot(ws, os.path.join(VDIR, "judge_files.json"))
    res["checker_s"] = round(time.monotonic() - started, 3)
    os.makedirs(os.path.dirname(REWARD_FILE) or ".", exist_ok=True)
    with open(REWARD_FILE, "w", encoding="utf-8") as fh:
        fh.write(repr(float(reward)))
    with open(os.path.join(VDIR, "details.json"), "w", encoding="utf-8") as fh:
        json.dump(res, fh)
    for name, value in sorted(res["scores"].items()):
        print(f"{'PASS' if value >= 1 else 'FAIL'} {name} {value:g}")
    print(f"reward {reward:g}" + (f" ({res['reason']})" if res["reason"] else ""))
    sys.exit(0 if reward >= float(cfg.get("threshold", 1.0)) else 1)


if __name__ == "__main__":
    main()
