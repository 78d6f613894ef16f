"""The `claw-tree` command line: a thin click group over the library.

stdout carries only data (JSONL, or the text of `stats` / `show`); notes go to stderr.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from claw_tree import __version__
from claw_tree._cli_paths import output_path
from claw_tree.advantages import GAE_LEVEL, GAMMA, LAM
from claw_tree.corpus import CallIndex, index_calls, stream_indexed_samples
from claw_tree.errors import ClawError
from claw_tree.options import (
    ALGOS,
    GAE_LEVELS,
    GROUP_BY,
    PACKS,
    PATH_WEIGHTING,
    SFT_PACKS,
    SFT_WEIGHTING,
    SampleOptions,
)
from claw_tree.records import read_calls, read_outcomes, read_values, write_jsonl
from claw_tree.routing import RoutingOut, RoutingStore
from claw_tree.samples import SampleBatch, SampleTally, stream_samples
from claw_tree.sft import stream_sft_samples
from claw_tree.show import load_decoder, render_session
from claw_tree.stats import forest_stats, session_stats
from claw_tree.tree import Forest, build_forest, trajectory_record

_SKIP = click.option(
    "--skip-invalid",
    is_flag=True,
    help="Skip malformed lines (their count and reasons go to stderr) instead of failing.",
)
_CALLS = click.argument("calls", default="-", type=click.Path(allow_dash=True, dir_okay=False))
_ROUTING_DIR = click.option(
    "--routing-dir",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="Where the calls' relative MoE routing files lie (default: next to each calls file or "
    "shard; stdin: the working directory).",
)
_ROUTING_OUT = click.option(
    "--routing-out",
    type=click.Path(dir_okay=False),
    default=None,
    callback=output_path,
    help="MoE routing: the samples' routing side store, referenced by this path as given "
    "(default with -o out.jsonl: out.routing next to it; needed for stdout output).",
)
_NO_ROUTING = click.option(
    "--no-routing", is_flag=True, help="Drop the calls' MoE routing (no side store, no field)."
)
_MAX_TOKENS = click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Pack sessions into samples of at most this many tokens (default: one sample per session).",
)


def _note(text: str) -> None:
    click.echo(text, err=True)


def _report_skipped(what: str, skipped: list[str]) -> None:
    if skipped:
        _note(f"claw-tree: skipped {len(skipped)} invalid {what} line(s):")
        for reason in skipped[:10]:
            _note(f"  {reason}")
        if len(skipped) > 10:
            _note(f"  ... and {len(skipped) - 10} more")


def _write_batch(batch: SampleBatch, rows: Iterator[dict], output: str) -> None:
    """Write a batch's samples as they are made (none held), then its summary and the first
    excluded sessions to stderr."""
    tally = SampleTally()
    write_jsonl(tally.counted(rows), output)
    _note(f"claw-tree: {batch.summary(tally)}")
    for session, why in sorted(batch.excluded.items())[:20]:
        _note(f"  excluded {session}: {why}")


def _routing_out(output: str, routing_out: str | None, no_routing: bool) -> RoutingOut:
    """Where `samples` / `sft-samples` store the samples' routing: --routing-out as given, else
    ``out.routing`` next to ``-o out.jsonl`` (referenced by its bare name), else unset."""
    if no_routing:
        return False
    if routing_out is not None:
        path = routing_out
    elif output != "-":
        path = str(Path(output).with_suffix(".routing"))
    else:
        return None
    if output != "-" and Path(path).resolve() == Path(output).resolve():
        raise click.UsageError(f"{path}: the routing store would overwrite the samples")
    return RoutingStore(path, name=routing_out or Path(path).name)


def _sample_error(exc: ClawError, routing_out: RoutingOut) -> click.ClickException:
    text = str(exc)
    if routing_out is None and "MoE routing" in text:
        text += "\nhint: samples on stdout need --routing-out PATH (or --no-routing)"
    return click.ClickException(text)


def _forest(
    calls: str, skip_invalid: bool, *, routing: bool = True, routing_dir: str | None = None
) -> Forest:
    try:
        result = read_calls(calls, skip_invalid=skip_invalid, routing_dir=routing_dir)
        _report_skipped("call", result.skipped)
        return build_forest(result.records, routing=routing)
    except ClawError as exc:
        raise click.ClickException(
            f"{exc}\nhint: --skip-invalid skips malformed lines and reports them"
        ) from None


def _index(calls: str, skip_invalid: bool, routing: bool, routing_dir: str | None) -> CallIndex:
    """The calls file indexed for `samples` (built unit by unit; see claw_tree.corpus)."""
    try:
        index = index_calls(
            calls, skip_invalid=skip_invalid, routing=routing, routing_dir=routing_dir
        )
    except ClawError as exc:
        raise click.ClickException(
            f"{exc}\nhint: --skip-invalid skips malformed lines and reports them"
        ) from None
    _report_skipped("call", index.skipped)
    return index


def _calls_source(
    calls: str, streamed: bool, skip_invalid: bool, routing: bool, routing_dir: str | None
) -> CallIndex | Forest:
    """The calls indexed (`samples` streamed from a file) or built into a forest."""
    if streamed:
        return _index(calls, skip_invalid, routing, routing_dir)
    return _forest(calls, skip_invalid, routing=routing, routing_dir=routing_dir)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="claw-tree")
def main() -> None:
    """claw-tree: prefix trees over recorded calls, tree-aware advantages, tree-packed samples.

    Reads claw.call/v1 (and claw.outcome/v1) JSONL; see `claw-tree COMMAND --help`.
    """


@main.command()
@_CALLS
@click.option(
    "-o",
    "--output",
    default="-",
    type=click.Path(allow_dash=True, dir_okay=False),
    callback=output_path,
    help="Where the trajectories go (JSONL, default stdout).",
)
@click.option(
    "--with-ids", is_flag=True, help="Include each path's input_ids, trainable mask and logprobs."
)
@_SKIP
def build(calls: str, output: str, with_ids: bool, skip_invalid: bool) -> None:
    """Build the prefix forest and print one JSON line per trajectory (root-to-leaf path).

    Each line: session, trajectory, tokens, trainable_tokens, calls (that made the path) and
    spans (start/stop along the path, kind output|context, generating call).

    Example:

        claw-tree build calls.jsonl | jq -c '{session, tokens, calls}'
    """
    forest = _forest(calls, skip_invalid, routing=False)
    write_jsonl(
        (trajectory_record(forest, t, with_ids=with_ids) for t in forest.trajectories), output
    )
    _note(
        f"claw-tree: {len(forest.sessions)} sessions, {len(forest.trajectories)} trajectories, "
        f"{forest.n_nodes} tree tokens"
    )


@main.command()
@_CALLS
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option("--per-session", is_flag=True, help="Add one entry per session.")
@_ROUTING_DIR
@_SKIP
def stats(
    calls: str, as_json: bool, per_session: bool, routing_dir: str | None, skip_invalid: bool
) -> None:
    """Summarise the forest: sessions, calls, flat vs tree tokens, branches and why, depth
    (and, for calls with MoE routing, routed tokens and routing forks).

    Example:

        claw-tree stats --json calls.jsonl | jq .tree_token_ratio
    """
    forest = _forest(calls, skip_invalid, routing_dir=routing_dir)
    summary = forest_stats(forest)
    if per_session:
        summary["per_session"] = [session_stats(forest, t.name) for t in forest.sessions]
    if as_json:
        click.echo(json.dumps(summary))
        return
    for key, value in summary.items():
        if key == "per_session":
            continue
        if isinstance(value, float):
            value = f"{value:.4g}"
        elif isinstance(value, dict):
            value = ", ".join(
                f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in value.items()
            )
        click.echo(f"{key:22} {value}")
    for row in summary.get("per_session", []):
        click.echo(
            f"  {row['session']}: {row['calls']} calls, {row['flat_tokens']} flat -> "
            f"{row['tree_tokens']} tree tokens, {row['trajectories']} trajectories, "
            f"{row['branches']} branches"
        )


@main.command()
@_CALLS
@click.argument(
    "outcomes_arg",
    metavar="[OUTCOMES]",
    required=False,
    default=None,
    type=click.Path(allow_dash=True, dir_okay=False),
)
@click.option(
    "--outcomes",
    type=click.Path(allow_dash=True, dir_okay=False),
    default=None,
    help="claw.outcome/v1 JSONL (rewards, status, group keys); or give it as 2nd argument.",
)
@click.option(
    "--algo",
    type=click.Choice(ALGOS),
    default="grpo",
    show_default=True,
    help="Advantage estimator: group-relative (grpo), leave-one-out (rloo), reward minus "
    "--baseline (reinforce), or GAE on the tree with --values (ppo).",
)
@click.option(
    "-o",
    "--output",
    default="-",
    type=click.Path(allow_dash=True, dir_okay=False),
    callback=output_path,
    help="Where the claw.sample/v1 lines go (default stdout).",
)
@click.option(
    "--group-by",
    type=click.Choice(GROUP_BY),
    default="group",
    show_default=True,
    help="Group key for GRPO/RLOO: the outcome's group, its task, or task+harness.",
)
@click.option("--no-std", is_flag=True, help="GRPO: centre only, do not divide by the group std.")
@click.option(
    "--path-weighting",
    type=click.Choice(PATH_WEIGHTING),
    default="token",
    show_default=True,
    help="token: each rollout counts once, spread evenly over its trainable tokens; rollout: each "
    "rollout counts once, its paths share the vote equally; path: plain mean over paths.",
)
@_MAX_TOKENS
@click.option(
    "--pack",
    type=click.Choice(PACKS),
    default="session",
    show_default=True,
    help="session: one tree per rollout; group: the rollouts of a group (--group-by) in one tree "
    "whose shared context prefix (system prompt, tools, instruction) appears once; batch: every "
    "group of one harness in one tree (the harness's prompt once per sample; use --max-tokens). "
    "Same advantages, same loss.",
)
@click.option(
    "--values",
    "values_path",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help='PPO: JSONL of {"sample_id": ..., "values": [...]} aligned with the samples of this same command.',
)
@click.option(
    "--gamma",
    type=float,
    default=GAMMA,
    show_default=True,
    help="PPO discount per time step (a generated token, or a turn with --gae-level turn).",
)
@click.option(
    "--lam",
    type=float,
    default=LAM,
    show_default=True,
    help="PPO GAE lambda (1: a terminal reward reaches every token; see gae_on_tree).",
)
@click.option(
    "--gae-level",
    type=click.Choice(GAE_LEVELS),
    default=GAE_LEVEL,
    show_default=True,
    help="PPO time step: token (every generated token) or turn (one per call, values at call boundaries).",
)
@click.option(
    "--baseline", type=float, default=0.0, show_default=True, help="REINFORCE constant baseline."
)
@click.option(
    "--id-prefix",
    default=None,
    help="Sample ids are PREFIX-0, PREFIX-1, ... (default: the algo name).",
)
@_ROUTING_OUT
@_NO_ROUTING
@_ROUTING_DIR
@_SKIP
def samples(
    calls: str,
    outcomes_arg: str | None,
    outcomes: str | None,
    algo: str,
    output: str,
    group_by: str,
    no_std: bool,
    path_weighting: str,
    max_tokens: int | None,
    pack: str,
    values_path: str | None,
    gamma: float,
    lam: float,
    gae_level: str,
    baseline: float,
    id_prefix: str | None,
    routing_out: str | None,
    no_routing: bool,
    routing_dir: str | None,
    skip_invalid: bool,
) -> None:
    """Tree-pack rollouts into claw.sample/v1 lines with advantages and exact loss weights.

    Outcomes join by session; rollouts that are not `ok` are excluded and reported on stderr.
    PPO: run once without --values, let the critic write values for those samples, then run
    again with the same inputs and options plus --values to get GAE advantages and returns.
    A calls file is indexed once and built a few sessions, groups or harness buckets at a time
    (memory bounded by the largest of them); stdin and PPO build it whole. MoE routing goes to
    a side store (-o out.jsonl: out.routing; stdout: --routing-out), or --no-routing.

    Example:

        claw-tree samples calls.jsonl --outcomes outcomes.jsonl --algo grpo > samples.jsonl

        claw-tree samples --algo ppo --values v.jsonl calls.jsonl outcomes.jsonl > ppo.jsonl

        claw-tree samples --pack group calls.jsonl outcomes.jsonl > grouped.jsonl

        claw-tree samples --pack batch --max-tokens 65536 calls.jsonl outcomes.jsonl > batch.jsonl
    """
    if (outcomes_arg is None) == (outcomes is None):
        raise click.UsageError(
            "give the outcomes once: `samples CALLS OUTCOMES` or `--outcomes FILE`"
        )
    outcomes = outcomes or outcomes_arg
    if calls == "-" and outcomes == "-":
        raise click.UsageError("calls and --outcomes cannot both be stdin")
    streamed = calls != "-" and algo != "ppo" and values_path is None
    store = _routing_out(output, routing_out, no_routing)
    source = _calls_source(calls, streamed, skip_invalid, not no_routing, routing_dir)
    try:
        result = read_outcomes(outcomes, skip_invalid=skip_invalid)
        _report_skipped("outcome", result.skipped)
        values = None if values_path is None else read_values(values_path)
        if algo == "ppo" and values is None:
            _note("claw-tree: no --values: GAE runs with V = 0 (advantages: Monte Carlo returns)")
        options = SampleOptions(
            algo=algo,
            group_by=group_by,
            scale_by_std=not no_std,
            weighting=path_weighting,
            max_tokens=max_tokens,
            pack=pack,
            gamma=gamma,
            lam=lam,
            gae_level=gae_level,
            baseline=baseline,
            id_prefix=id_prefix,
        )
        if isinstance(source, CallIndex):
            batch, rows = stream_indexed_samples(source, result.records, options, routing_out=store)
        else:
            batch, rows = stream_samples(
                source, result.records, options, values=values, routing_out=store
            )
        _write_batch(batch, rows, output)
    except ClawError as exc:
        raise _sample_error(exc, store) from None


@main.command("sft-samples")
@_CALLS
@click.option(
    "-o",
    "--output",
    default="-",
    type=click.Path(allow_dash=True, dir_okay=False),
    callback=output_path,
    help="Where the claw.sample/v1 lines (algo sft) go (default stdout).",
)
@click.option(
    "--outcomes",
    type=click.Path(allow_dash=True, dir_okay=False),
    default=None,
    help="claw.outcome/v1 JSONL: keep only rollouts whose outcome is ok (and, with "
    "--passed-only, passed). Not needed otherwise: SFT samples come from calls alone.",
)
@click.option(
    "--passed-only",
    is_flag=True,
    help="Rejection-sampling fine-tuning: keep only rollouts whose outcome passed (needs --outcomes).",
)
@click.option(
    "--weighting",
    type=click.Choice(SFT_WEIGHTING),
    default="token",
    show_default=True,
    help="token: every generated token counts once (each recorded call its own example); "
    "path: weight 1 per root-to-leaf path (a shared token counts once per path through it).",
)
@_MAX_TOKENS
@click.option(
    "--pack",
    type=click.Choice(SFT_PACKS),
    default="session",
    show_default=True,
    help="session: one tree per rollout; group (or batch, the same here): rollouts share trees "
    "of at most --max-tokens tokens in which their common context prefix (system prompt, tools) "
    "appears once. Same loss.",
)
@click.option(
    "--id-prefix",
    default="sft",
    show_default=True,
    help="Sample ids are PREFIX-0, PREFIX-1, ...",
)
@_ROUTING_OUT
@_NO_ROUTING
@_ROUTING_DIR
@_SKIP
def sft_samples(
    calls: str,
    output: str,
    outcomes: str | None,
    passed_only: bool,
    weighting: str,
    max_tokens: int | None,
    pack: str,
    id_prefix: str,
    routing_out: str | None,
    no_routing: bool,
    routing_dir: str | None,
    skip_invalid: bool,
) -> None:
    """Tree-pack recorded calls into supervised fine-tuning samples (claw.sample/v1, algo sft).

    Every completion token of a trainable call is a target (weight per --weighting), context is
    not; shared prefixes are packed once, as for RL samples. No outcomes are needed; with
    --outcomes --passed-only only rollouts that passed are kept (rejection-sampling fine-tuning).
    Train with `claw-rl sft`. MoE routing goes to a side store as for `samples`.

    Example:

        claw-tree sft-samples teacher_calls.jsonl -o sft.jsonl

        claw-tree sft-samples calls.jsonl --outcomes outcomes.jsonl --passed-only > rft.jsonl

        claw-tree sft-samples --pack group --max-tokens 8192 teacher_calls.jsonl > sft.jsonl
    """
    if passed_only and outcomes is None:
        raise click.UsageError("--passed-only needs --outcomes (which rollouts passed)")
    if calls == "-" and outcomes == "-":
        raise click.UsageError("calls and --outcomes cannot both be stdin")
    store = _routing_out(output, routing_out, no_routing)
    forest = _forest(calls, skip_invalid, routing=not no_routing, routing_dir=routing_dir)
    try:
        records = None
        if outcomes is not None:
            result = read_outcomes(outcomes, skip_invalid=skip_invalid)
            _report_skipped("outcome", result.skipped)
            records = result.records
        options = SampleOptions(
            algo="sft",
            passed_only=passed_only,
            weighting=weighting,
            max_tokens=max_tokens,
            id_prefix=id_prefix,
            pack=pack,
        )
        batch, rows = stream_sft_samples(
            forest, outcomes=records, options=options, routing_out=store
        )
        _write_batch(batch, rows, output)
    except ClawError as exc:
        raise _sample_error(exc, store) from None


@main.command()
@click.argument("session")
@_CALLS
@click.option(
    "--tokenizer",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="HF tokenizer/model directory: show decoded text of each segment.",
)
@click.option(
    "--max-chars",
    type=int,
    default=100,
    show_default=True,
    help="Clip decoded text to this many characters.",
)
@_SKIP
def show(
    session: str, calls: str, tokenizer: str | None, max_chars: int, skip_invalid: bool
) -> None:
    """Print one session's tree: segments, branch points, token counts, calls, leaves.

    Example:

        claw-tree show s-3f2a calls.jsonl --tokenizer runs/tiny
    """
    forest = _forest(calls, skip_invalid, routing=False)
    try:
        decode = load_decoder(tokenizer) if tokenizer else None
        click.echo(render_session(forest, session, decode=decode, max_chars=max_chars))
    except ClawError as exc:
        raise click.ClickException(str(exc)) from None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
