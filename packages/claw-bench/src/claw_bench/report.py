"""Reports over claw.outcome/v1: Pass@1 and Pass@k per harness and per task, with bootstrap CIs."""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np

from claw_bench.errors import ClawError, RecordError
from claw_bench.passk import bootstrap_mean_ci, bootstrap_task_ci, pass_at_k


def _cell(value: float, lo: float, hi: float) -> dict[str, float]:
    return {"value": value, "lo": lo, "hi": hi}


#: the claw.outcome/v1 fields report reads, and so validates (a projection reader: docs/formats.md,
#: Readers); every other field is ignored
OUTCOME_READS = ("schema", "harness", "task", "status", "reward", "passed")


def check_outcome(o: Any, where: str = "outcome") -> None:
    """Validate the fields of a claw.outcome/v1 dict that `report` reads (`OUTCOME_READS`):
    RecordError naming `where` and the field. Fields it does not read pass unchecked."""
    if not isinstance(o, dict):
        raise RecordError(f"{where}: expected a JSON object, got {type(o).__name__}")
    for key in ("harness", "task"):
        if not isinstance(o.get(key), str) or not o[key]:
            raise RecordError(
                f"{where}: field {key!r} must be a non-empty string, got {o.get(key)!r:.60}"
            )
    status, reward, passed = o.get("status"), o.get("reward", "missing"), o.get("passed", "missing")
    if status not in ("ok", "infra_error", "not_scorable"):
        raise RecordError(
            f"{where}: field 'status' must be ok, infra_error or not_scorable, got {status!r:.60}"
        )
    if reward is not None and (type(reward) not in (int, float) or not 0.0 <= reward <= 1.0):
        raise RecordError(
            f"{where}: field 'reward' must be a number in [0, 1] or null, got {reward!r:.60}"
        )
    if passed is not None and not isinstance(passed, bool):
        raise RecordError(f"{where}: field 'passed' must be a boolean or null, got {passed!r:.60}")
    if (status == "ok") != (reward is not None) or (status == "ok") != (passed is not None):
        field = "reward" if (status == "ok") != (reward is not None) else "passed"
        raise RecordError(
            f"{where}: field {field!r} must be null exactly when status is not ok (status {status!r})"
        )


def _tally(
    outcomes: Iterable[dict[str, Any]],
) -> tuple[dict[tuple[str, str], list[dict[str, Any]]], dict[str, int], dict[str, int]]:
    """(scored outcomes per (harness, task), infra errors per harness, not scorable per harness);
    each outcome is checked first (`check_outcome`)."""
    by_pair: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    errors: dict[str, int] = defaultdict(int)
    unscorable: dict[str, int] = defaultdict(int)
    for i, o in enumerate(outcomes, start=1):
        check_outcome(o, f"outcome #{i}")
        if o.get("status") == "ok" and isinstance(o.get("passed"), bool):
            by_pair[(o["harness"], o["task"])].append(o)
        elif o.get("status") == "not_scorable":
            unscorable[o["harness"]] += 1
        else:
            errors[o["harness"]] += 1
    return by_pair, errors, unscorable


def _task_row(
    h: str,
    t: str,
    rows: list[dict[str, Any]],
    ks: list[int],
    thresholds: list[float],
    boot: dict[str, Any],
) -> tuple[dict[str, Any], dict[int, float], list[float]]:
    """(the row of one (harness, task), its Pass@k per k it has samples for, its rewards)."""
    res = np.array([bool(r["passed"]) for r in rows], dtype=int)
    rewards = [float(r["reward"]) for r in rows if isinstance(r.get("reward"), int | float)]
    n, c = int(res.size), int(res.sum())
    row: dict[str, Any] = {
        "harness": h,
        "task": t,
        "n": n,
        "passed": c,
        "pass_rate": c / n,
        "mean_reward": float(np.mean(rewards)) if rewards else None,
    }
    for thr in thresholds:
        row[f"pass_rate@{thr:g}"] = float(np.mean([x >= thr for x in rewards])) if rewards else None
    values = {}
    for k in ks:
        if k <= n:
            values[k] = v = pass_at_k(n, c, k)
            row[f"pass@{k}"] = _cell(v, *bootstrap_task_ci(res, k, **boot))
    return row, values, rewards


def _harness_row(
    h: str,
    d: dict[str, Any],
    tasks: int,
    counts: dict[str, int],
    ks: list[int],
    thresholds: list[float],
    boot: dict[str, Any],
) -> dict[str, Any]:
    """One harness's row: its samples, infra errors and not scorable counts, pass rate, mean
    reward, and Pass@k as the mean over its tasks with a CI resampling them."""
    hrow: dict[str, Any] = {
        "harness": h,
        "tasks": tasks,
        "samples": d["n"],
        **counts,
        "pass_rate": d["c"] / d["n"] if d["n"] else None,
        "mean_reward": float(np.mean(d["rewards"])) if d["rewards"] else None,
    }
    for thr in thresholds:
        hrow[f"pass_rate@{thr:g}"] = (
            float(np.mean([x >= thr for x in d["rewards"]])) if d["rewards"] else None
        )
    for k in ks:
        vals = np.array(d["values"].get(k, []))
        if vals.size:
            hrow[f"pass@{k}"] = _cell(float(vals.mean()), *bootstrap_mean_ci(vals, **boot))
            hrow[f"pass@{k}"]["tasks"] = int(vals.size)
    return hrow


def report(
    outcomes: Iterable[dict[str, Any]],
    *,
    ks: list[int] | None = None,
    confidence: float = 0.95,
    rounds: int = 2000,
    seed: int = 0,
    thresholds: list[float] | None = None,
) -> dict[str, Any]:
    """Pass@k per harness and per (harness, task), with percentile-bootstrap confidence intervals.

    Scored outcomes (status ok) count; infra errors and unscorable ones are counted apart and
    never as failures. Per harness, Pass@k is the mean over tasks of the unbiased per-task
    estimate, over the tasks with at least k scored samples; its CI resamples tasks. Per task,
    the CI resamples that task's samples. ``ks`` defaults to 1 and the largest sample count.
    ``thresholds`` adds, per harness and task, the pass rate re-judged from the continuous
    reward as ``reward >= t`` (``pass_rate@t``), beside the recorded ``passed`` rate.
    """
    by_pair, errors, unscorable = _tally(outcomes)
    if not by_pair and not errors and not unscorable:
        raise ClawError("no outcomes to report")
    nmax = max((len(v) for v in by_pair.values()), default=1)
    ks = sorted(set(ks or ([1, nmax] if nmax > 1 else [1])))
    if any(k < 1 for k in ks):
        raise ClawError(f"k must be >= 1, got {ks}")
    boot = {"rounds": rounds, "confidence": confidence, "seed": seed}
    tasks_rows = []
    per_h: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"values": defaultdict(list), "rewards": [], "n": 0, "c": 0}
    )
    for (h, t), rows in sorted(by_pair.items()):
        row, values, rewards = _task_row(h, t, rows, ks, thresholds or [], boot)
        for k, v in values.items():
            per_h[h]["values"][k].append(v)
        per_h[h]["rewards"].extend(rewards)
        per_h[h]["n"] += row["n"]
        per_h[h]["c"] += row["passed"]
        tasks_rows.append(row)
    harness_rows = [
        _harness_row(
            h,
            per_h[h],
            sum(1 for (hh, _) in by_pair if hh == h),
            {"infra_errors": errors.get(h, 0), "not_scorable": unscorable.get(h, 0)},
            ks,
            thresholds or [],
            boot,
        )
        for h in sorted(set(per_h) | set(errors) | set(unscorable))
    ]
    return {
        "ks": ks,
        "confidence": confidence,
        "rounds": rounds,
        "harnesses": harness_rows,
        "tasks": tasks_rows,
        "thresholds": [float(t) for t in thresholds or []],
    }


def _fmt(cell: dict[str, float] | None) -> str:
    if not cell:
        return "-"
    return f"{100 * cell['value']:5.1f} [{100 * cell['lo']:5.1f},{100 * cell['hi']:5.1f}]"


def _fmt_r(v: float | None) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render_text(rep: dict[str, Any], *, per_task: bool = True) -> str:
    """The report as plain-text tables (percentages, CI in brackets)."""
    ks = rep["ks"]
    conf = int(round(100 * rep["confidence"]))
    thr = [f"pass_rate@{t:g}" for t in rep.get("thresholds", [])]
    head = [
        "harness",
        "tasks",
        "samples",
        "infra_err",
        "unscored",
        "reward",
        "pass_rate",
        *thr,
        *[f"pass@{k} ({conf}% CI)" for k in ks],
    ]
    rows = [
        [
            h["harness"],
            str(h["tasks"]),
            str(h["samples"]),
            str(h["infra_errors"]),
            str(h["not_scorable"]),
            _fmt_r(h["mean_reward"]),
            _fmt_r(h["pass_rate"]),
            *[_fmt_r(h.get(c)) for c in thr],
            *[_fmt(h.get(f"pass@{k}")) for k in ks],
        ]
        for h in rep["harnesses"]
    ]
    out = [_table(head, rows)]
    if per_task and rep["tasks"]:
        head = ["harness", "task", "n", "passed", "reward", *thr, *[f"pass@{k}" for k in ks]]
        rows = [
            [
                t["harness"],
                t["task"],
                str(t["n"]),
                str(t["passed"]),
                _fmt_r(t["mean_reward"]),
                *[_fmt_r(t.get(c)) for c in thr],
                *[_fmt(t.get(f"pass@{k}")) for k in ks],
            ]
            for t in rep["tasks"]
        ]
        out.append(_table(head, rows))
    return "\n\n".join(out) + "\n"


def compare(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Two reports side by side: per harness and per task, each Pass@k before, after and delta."""
    ks = [k for k in after["ks"] if k in before["ks"]]

    def side(rows: list[dict], key: tuple[str, ...]) -> dict[tuple, dict]:
        return {tuple(r[k] for k in key): r for r in rows}

    out: dict[str, Any] = {"ks": ks, "harnesses": [], "tasks": []}
    for name, key in (("harnesses", ("harness",)), ("tasks", ("harness", "task"))):
        a, b = side(before[name], key), side(after[name], key)
        for ident in sorted(set(a) | set(b)):
            row: dict[str, Any] = dict(zip(key, ident, strict=True))
            for k in ks:
                x = (a.get(ident) or {}).get(f"pass@{k}")
                y = (b.get(ident) or {}).get(f"pass@{k}")
                row[f"pass@{k}"] = {
                    "before": x,
                    "after": y,
                    "delta": (y["value"] - x["value"]) if x and y else None,
                }
            ra, rb = (
                (a.get(ident) or {}).get("mean_reward"),
                (b.get(ident) or {}).get("mean_reward"),
            )
            row["mean_reward"] = {
                "before": ra,
                "after": rb,
                "delta": (rb - ra) if ra is not None and rb is not None else None,
            }
            out[name].append(row)
    return out


def render_compare(cmp: dict[str, Any], *, per_task: bool = True) -> str:
    """A comparison as plain-text tables: before | after | delta (percentage points)."""

    def cells(row: dict[str, Any]) -> list[str]:
        out = []
        for k in cmp["ks"]:
            c = row[f"pass@{k}"]
            d = c["delta"]
            out += [_fmt(c["before"]), _fmt(c["after"]), "-" if d is None else f"{100 * d:+.1f}"]
        r = row["mean_reward"]
        return [*out, _fmt_r(r["before"]), _fmt_r(r["after"])]

    cols = [h for k in cmp["ks"] for h in (f"pass@{k} before", f"pass@{k} after", "delta")] + [
        "reward before",
        "reward after",
    ]
    parts = [_table(["harness", *cols], [[r["harness"], *cells(r)] for r in cmp["harnesses"]])]
    if per_task:
        parts.append(
            _table(
                ["harness", "task", *cols],
                [[r["harness"], r["task"], *cells(r)] for r in cmp["tasks"]],
            )
        )
    return "\n\n".join(parts) + "\n"


def plot_report(
    rep: dict[str, Any],
    path: str,
    *,
    other: dict[str, Any] | None = None,
    labels: tuple[str, str] = ("before", "after"),
) -> str:
    """Bar chart of Pass@k per harness with CI error bars; with ``other``, two bars (before, after).

    The format follows ``path``'s extension; a path without one gets ``.png``. Returns the path
    written. Needs matplotlib (``pip install 'claw-bench[plot]'``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ClawError("plotting needs matplotlib: pip install 'claw-bench[plot]'") from exc
    reports = [(labels[0], other), (labels[1], rep)] if other is not None else [("", rep)]
    ks = rep["ks"] if other is None else [k for k in rep["ks"] if k in other["ks"]]
    harnesses = sorted({h["harness"] for _, r in reports for h in r["harnesses"]})
    fig, axes = plt.subplots(
        1,
        len(ks),
        figsize=(max(4.0, 1.2 * len(harnesses) * len(reports)) * len(ks), 4),
        squeeze=False,
    )
    width = 0.8 / len(reports)
    for ax, k in zip(axes[0], ks, strict=True):
        for j, (label, r) in enumerate(reports):
            rows = {h["harness"]: h.get(f"pass@{k}") for h in r["harnesses"]}
            vals = np.array([100 * rows[h]["value"] if rows.get(h) else 0.0 for h in harnesses])
            lo = np.array(
                [
                    100 * (rows[h]["value"] - rows[h]["lo"]) if rows.get(h) else 0.0
                    for h in harnesses
                ]
            )
            hi = np.array(
                [
                    100 * (rows[h]["hi"] - rows[h]["value"]) if rows.get(h) else 0.0
                    for h in harnesses
                ]
            )
            x = np.arange(len(harnesses)) + (j - (len(reports) - 1) / 2) * width
            ax.bar(x, vals, width, yerr=np.vstack([lo, hi]), capsize=3, label=label or None)
        ax.set_xticks(np.arange(len(harnesses)), harnesses, rotation=20, ha="right")
        ax.set_ylim(0, 110)
        ax.set_ylabel(f"pass@{k} (%)")
        ax.set_title(f"pass@{k}, {int(round(100 * rep['confidence']))}% bootstrap CI")
        if other is not None:
            ax.legend(loc="upper center", ncol=2, fontsize="small")
    fig.tight_layout()
    out = path if os.path.splitext(path)[1] else path + ".png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
