"""The `claw-rl` command line: a thin click group over the library."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import attrs
import click

from claw_rl import __version__
from claw_rl._cli_paths import input_path, output_path, refuse_taken_policies, run_dir
from claw_rl.errors import ClawError, ConfigError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="claw-rl")
def main() -> None:
    """claw-rl: PPO, GRPO and SFT learners on tree-packed samples."""


def _fail(exc: ClawError, hint: str = "") -> click.ClickException:
    return click.ClickException(f"{exc}{'  (' + hint + ')' if hint else ''}")


@main.command("init-tiny")
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--seed", default=0, show_default=True, help="Seed for the tokenizer corpus and the weights."
)
@click.option("--layers", default=2, show_default=True, help="Number of transformer layers.")
@click.option("--hidden", default=128, show_default=True, help="Hidden size.")
@click.option(
    "--split-digits/--no-split-digits",
    default=False,
    show_default=True,
    help="One token per digit, as Qwen's tokenizer splits numbers (a tiny model then learns to "
    "copy numbers it has not seen, e.g. on claw-toy's toy-steps).",
)
@click.option(
    "--corpus",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A text file the tokenizer also learns from, whole (repeatable): e.g. a harness's "
    "prompts, so its long fixed parts become few tokens.",
)
@click.option("--vocab-size", default=4096, show_default=True, help="Tokenizer vocabulary size.")
@click.option(
    "--cross-word-merges/--word-merges",
    default=False,
    show_default=True,
    help="Let BPE merges span spaces (no split into words first): with --corpus and a larger "
    "--vocab-size, a harness's system prompt shrinks about 20x.",
)
@click.option(
    "--moe/--dense",
    default=False,
    show_default=True,
    help="A Qwen3-MoE model: every layer a sparse block of --experts experts, each token routed "
    "to --experts-per-token of them.",
)
@click.option(
    "--experts",
    type=click.IntRange(min=1),
    default=None,
    help="Experts per MoE layer (implies --moe).  [default: 8]",
)
@click.option(
    "--experts-per-token",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Experts each token is routed to (top-k), with --moe.",
)
def init_tiny_cmd(out_dir: Path, seed: int, layers: int, hidden: int, split_digits: bool,
                  corpus: tuple[Path, ...], vocab_size: int, cross_word_merges: bool, moe: bool,
                  experts: int | None, experts_per_token: int) -> None:  # fmt: skip
    """Write a tiny random-weight Qwen3 model and a locally trained tokenizer to OUT_DIR.

    The tokenizer is a byte-level BPE trained in-process (no hub download) and carries a
    Qwen3-style chat template with tools. The directory loads with AutoModelForCausalLM /
    AutoTokenizer offline. With --moe it is a Qwen3MoeForCausalLM (8 experts, top-2).

    Example:

        claw-rl init-tiny runs/tiny && claw-proxy serve --engine transformers:runs/tiny ...
    """
    from claw_rl.tiny import TinySpec, init_tiny

    try:
        texts = tuple(p.read_text(encoding="utf-8", errors="replace") for p in corpus)
        num_experts = (experts or 8) if moe or experts else 0
        spec = TinySpec(
            seed=seed, num_hidden_layers=layers, hidden_size=hidden, split_digits=split_digits,
            corpus=texts, vocab_size=vocab_size, cross_word_merges=cross_word_merges,
            num_experts=num_experts, num_experts_per_tok=experts_per_token,
        )  # fmt: skip
        path = init_tiny(out_dir, spec)
    except ClawError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(str(path))


# -- train: every config field is a flag ------------------------------------------------------


def _config_fields(
    algos: tuple[str, ...] = ("grpo", "ppo"),
) -> dict[str, tuple[attrs.Attribute, dict[str, object]]]:
    """field name -> (attribute, {algo: default}) over the config classes of ``algos``."""
    from claw_rl.config import CONFIGS

    out: dict[str, tuple[attrs.Attribute, dict[str, object]]] = {}
    for algo in algos:
        for f in attrs.fields(CONFIGS[algo]):
            prev = out.get(f.name)
            out[f.name] = (prev[0] if prev else f, {**(prev[1] if prev else {}), algo: f.default})
    return out


def _config_options(algos: tuple[str, ...]):
    """A decorator adding one flag per config field of ``algos``."""
    return lambda fn: _add_config_options(fn, algos)


def _add_config_options(fn, algos: tuple[str, ...]):
    for name, (f, defaults) in reversed(list(_config_fields(algos).items())):
        flag = "--" + name.replace("_", "-")
        if len(defaults) == 1 and len(algos) > 1:
            default = f"{next(iter(defaults))} only; default {f.default!r}"
        elif len(set(map(repr, defaults.values()))) == 1:
            default = f"default {f.default!r}"
        else:
            default = "default " + ", ".join(f"{a}: {d!r}" for a, d in defaults.items())
        help_ = f"{f.metadata['help']} ({default})"
        if isinstance(f.default, bool):
            fn = click.option(
                f"{flag}/--no-{name.replace('_', '-')}", name, default=None, help=help_
            )(fn)
        else:
            typ = (
                click.Choice(f.metadata["choices"])
                if f.metadata.get("choices")
                else type(f.default)
            )
            fn = click.option(flag, name, type=typ, default=None, help=help_)(fn)
    return fn


def _run_options(algos: tuple[str, ...], *, samples: str, config: str, batch: str, resume: str):
    """The options `train` and `sft` share (model, samples, run directory, config, batching,
    resume, start version) plus the config flags of ``algos``; the help texts name what differs."""
    options = [
        click.option(
            "--model",
            "model_dir",
            type=click.Path(exists=True, file_okay=False, path_type=Path),
            help="HF model directory to start from (not needed with --resume).",
        ),
        click.option(
            "--samples",
            "samples_path",
            default="-",
            show_default=True,
            callback=input_path,
            help=samples,
        ),
        click.option(
            "-o",
            "--output",
            "out_dir",
            type=click.Path(file_okay=False, path_type=Path),
            required=True,
            callback=run_dir,
            metavar="OUT",
            help="Run directory: config.toml, metrics.jsonl, policies.jsonl, policy/vN/, "
            "checkpoints/K/.",
        ),
        click.option(
            "--config",
            "config_path",
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            help=config,
        ),
        click.option("--batch-size", type=int, default=0, show_default=True, help=batch),
        click.option(
            "--resume",
            "resume_dir",
            type=click.Path(exists=True, file_okay=False, path_type=Path),
            help=resume,
        ),
        click.option(
            "--start-version",
            type=int,
            default=0,
            show_default=True,
            help="Policy version of --model (the next saved policy is this + 1).",
        ),
        click.option(
            "--tensorboard",
            is_flag=True,
            help="Also log each metrics row to OUT/tensorboard (the tensorboard extra).",
        ),
        click.option(
            "--wandb",
            is_flag=True,
            help="Also log each metrics row to a W&B run in OUT/wandb (the wandb extra; "
            "WANDB_MODE=offline: no network, `wandb sync` it later).",
        ),
        _config_options(algos),
    ]

    def apply(fn):
        for option in reversed(options):
            fn = option(fn)
        return fn

    return apply


def resolve_config(algo: str, toml_path: Path | None, flags: dict):
    """TOML file first, then flags; a flag of the other algorithm is an error."""
    from claw_rl.config import CONFIGS, config_from_toml

    cls = CONFIGS[algo]
    known = attrs.fields_dict(cls)
    values = dict(config_from_toml(toml_path, algo)) if toml_path else {}
    for key, val in flags.items():
        if val is None:
            continue
        if key not in known:
            raise click.UsageError(f"--{key.replace('_', '-')} does not apply to --algo {algo}")
        values[key] = val
    return cls.from_dict(values, str(toml_path) if toml_path else "flags")


def _checkpoint_of(path: Path) -> Path:
    """``--resume``: a checkpoint directory, or a run directory (its last completed step's)."""
    from claw_rl import loop

    if (path / "state.json").exists() or not (path / "metrics.jsonl").exists():
        return path
    return loop.checkpoint_dir(path, len(loop.completed_steps(path)))


def _progress(n_steps: int, rank: int, algo: str):
    """The step indices, with a progress bar on a terminal (rank 0, more than one step)."""
    steps = range(n_steps)
    if rank != 0 or not sys.stderr.isatty() or n_steps < 2:
        return steps
    try:
        from tqdm import tqdm  # comes with transformers; no bar without it
    except ImportError:
        return steps
    desc = f"claw-rl {'sft' if algo == 'sft' else 'train'}"
    return tqdm(steps, desc=desc, unit="step", file=sys.stderr)


def _step_line(row: dict, describe) -> str:
    """The progress line of a step (stderr); a step without an update says why."""
    m = row["learner"]
    loss = f"loss {m['loss']:.4g}" if "loss" in m else m.get("skipped", "no update")
    return f"step {row['step']}: {loss}  {describe(m)}  {m['tokens_per_s']:.0f} tok/s"


def _run(
    algo: str,
    model_dir: Path | None,
    samples_path: str,
    out_dir: Path,
    config_path: Path | None,
    batch_size: int,
    resume_dir: Path | None,
    start_version: int,
    flags: dict,
    describe,
) -> None:
    """The loop `train` and `sft` share: one learner step per batch, a policy after each."""
    from claw_rl import loop
    from claw_rl._dist import init_from_env, shutdown
    from claw_rl.checkpoint import load_checkpoint
    from claw_rl.config import dump_toml
    from claw_rl.learner import Learner
    from claw_rl.records import read_samples, write_jsonl
    from claw_rl.tracking import close_trackers, open_trackers

    rank, _ = init_from_env()  # a no-op outside torchrun
    track = {key: flags.pop(key) for key in ("tensorboard", "wandb")}
    trackers: list = []
    try:
        # the command line first, then the samples file, then the model: the cheapest check first
        if resume_dir is not None:
            if any(v is not None for v in flags.values()) or config_path:
                raise click.UsageError(
                    "--resume continues with the checkpoint's config; drop the config flags"
                )
        elif model_dir is None:
            raise click.UsageError("--model is required (or --resume a checkpoint)")
        config = None if resume_dir is not None else resolve_config(algo, config_path, flags)
        samples = read_samples(samples_path)  # a bad file is reported before a model loads
        if not samples:
            raise click.ClickException(f"{samples_path}: no samples")
        if config is None or model_dir is None:  # --resume (checked above)
            assert resume_dir is not None
            learner = load_checkpoint(_checkpoint_of(resume_dir), algo=algo)
        else:
            learner = Learner.from_config(config, model_dir, version=start_version)
        size = batch_size if batch_size > 0 else len(samples)
        n_steps = (len(samples) + size - 1) // size
        refuse_taken_policies(out_dir, learner.version, n_steps, rank)  # before anything is written
        if rank == 0:
            try:
                out_dir.mkdir(parents=True, exist_ok=True)
                (out_dir / "config.toml").write_text(dump_toml(learner.config, algo))
            except OSError as exc:  # e.g. made unwritable since the command line was checked
                raise click.ClickException(f"--output {out_dir}: {exc.strerror}") from None
        steps = _progress(n_steps, rank, algo)
        if rank == 0:
            loop.drop_incomplete(out_dir)  # a policies.jsonl row of a step cut off in OUT
        first = len(loop.completed_steps(out_dir))
        if rank == 0:
            trackers = open_trackers(out_dir, **track, config=learner.config.to_dict())
        for k in steps:
            row, policy = loop.train_step(
                learner,
                samples[k * size : (k + 1) * size],
                out_dir,
                first + k,
                current=loop.latest_policy(out_dir),
                extra={"samples_file": samples_path, "batch": k},
            )
            if rank == 0:
                for tracker in trackers:
                    tracker.log(row)
                write_jsonl([policy], sys.stdout)
                click.echo(_step_line(row, describe), err=True)
    except ClawError as exc:
        raise _fail(exc) from exc
    finally:
        close_trackers(trackers)
    shutdown()


@main.command("train")
@click.option(
    "--algo", type=click.Choice(["grpo", "ppo"]), required=True, help="Learner algorithm."
)
@_run_options(
    ("grpo", "ppo"),
    samples="claw.sample/v1 JSONL file.",
    config="TOML config ([grpo] / [ppo] table or flat keys); flags override it.",
    batch="Samples per learner step (0 = the whole file is one step).",
    resume="Continue from a run directory (its last completed step) or a checkpoint directory.",
)
def train_cmd(
    algo,
    model_dir,
    samples_path,
    out_dir,
    config_path,
    batch_size,
    resume_dir,
    start_version,
    **flags,
) -> None:
    """Train on tree-packed samples; print one claw.policy/v1 line per update.

    After each step the weights are saved to OUT/policy/vN (HF directory, safetensors), the
    step's row is appended to OUT/metrics.jsonl and the policy record to OUT/policies.jsonl
    and stdout; OUT/checkpoints/K holds the learner state after K steps (--resume OUT). The
    run directory is claw_rl.loop's, the one examples/mix_harness_rl.py writes.
    Under torchrun every rank reads the same file; rank 0 writes.

    Example:

    \b
        claw-tree samples calls.jsonl --outcomes outcomes.jsonl --algo grpo \\
          | claw-rl train --algo grpo --model runs/tiny -o runs/rl --lr 1e-5

        torchrun --nproc_per_node 2 $(which claw-rl) train --algo ppo ...
    """
    _run(
        algo,
        model_dir,
        samples_path,
        out_dir,
        config_path,
        batch_size,
        resume_dir,
        start_version,
        flags,
        lambda m: f"clip {m.get('clip_frac', 0.0):.3f}  mismatch {m['mismatch_mean_abs']:.3g}",
    )


@main.command("sft")
@_run_options(
    ("sft",),
    samples="claw.sample/v1 JSONL file of SFT samples (algo sft, from `claw-tree sft-samples`).",
    config="TOML config ([sft] table or flat keys); flags override it.",
    batch="Samples per learner step, each saving a policy (0 = the whole file is one step).",
    resume="Continue from a sft run directory (its last completed step) or a checkpoint directory.",
)
def sft_cmd(
    model_dir,
    samples_path,
    out_dir,
    config_path,
    batch_size,
    resume_dir,
    start_version,
    **flags,
) -> None:
    """Supervised fine-tuning on tree-packed samples; print one claw.policy/v1 line per step.

    The loss is the loss-weighted mean negative log-likelihood of every trainable (completion)
    token, at temperature 1 whatever the teacher sampled with; a prefix shared by several calls
    is computed once. Each learner step makes --epochs passes over its batch in --minibatches
    shuffled optimizer steps. Outputs, --resume and torchrun work as in `claw-rl train`:
    OUT/policy/vN after each step, OUT/metrics.jsonl, OUT/policies.jsonl (and stdout),
    OUT/checkpoints/K (--resume OUT).

    Example:

    \b
        claw-tree sft-samples teacher_calls.jsonl -o sft.jsonl
        claw-rl sft --model runs/tiny --samples sft.jsonl -o runs/sft \\
          --lr 3e-3 --epochs 50 --minibatches 3 --micro-batch-size 16

        torchrun --nproc_per_node 2 $(which claw-rl) sft --model M --samples sft.jsonl -o runs/sft
    """
    _run(
        "sft",
        model_dir,
        samples_path,
        out_dir,
        config_path,
        batch_size,
        resume_dir,
        start_version,
        flags,
        lambda m: f"grad_norm {m.get('grad_norm', 0.0):.3g}",
    )


# -- follow: the learner of a loop in another job ------------------------------------------------


def _loop_config(algo: str, run: Path, config_path, flags: dict, wait_s: float):
    """A new follower's config: the loop's learner settings published with the first batch
    (waited for), unless a --config file is given; a flag given must agree with the loop's."""
    from claw_rl import loop

    if config_path is not None:
        return resolve_config(algo, config_path, flags)
    published = loop.published_learner(run, 0, wait_s)
    given = {k: v for k, v in flags.items() if v is not None}
    if differ := sorted(k for k in given if k in published and published[k] != given[k]):
        raise click.UsageError(
            f"{run}: the loop trains with {', '.join(f'{k} = {published[k]!r}' for k in differ)} "
            "(steps/0000/batch.json); drop those options or give the loop the same"
        )
    try:
        return resolve_config(algo, None, {**published, **given})
    except ConfigError as exc:  # the loop's settings are range-checked as a config file's are
        marker = loop.step_dir(run, 0) / loop.BATCH_MARKER
        raise ConfigError(f"{marker} (the loop's learner settings): {exc}") from None


def _start_learner(
    algo: str, run: Path, model_dir: Path | None, config_path, flags: dict, done: int,
    wait_s: float,
):  # fmt: skip
    """The follower's learner: from RUN's checkpoint after ``done`` steps (the config flags and
    file given must agree with its config), or new on ``model_dir`` with the loop's settings."""
    from claw_rl import loop
    from claw_rl.checkpoint import load_checkpoint
    from claw_rl.config import config_from_toml
    from claw_rl.learner import Learner

    if not done:
        if model_dir is None:
            raise click.UsageError(f"--model is required: {run} has no completed step to resume")
        return Learner.from_config(_loop_config(algo, run, config_path, flags, wait_s), model_dir)
    config = resolve_config(algo, config_path, flags)
    learner = load_checkpoint(loop.checkpoint_dir(run, done), algo=algo)
    given = {k for k, v in flags.items() if v is not None}
    given |= set(config_from_toml(config_path, algo)) if config_path else set()
    if differ := sorted(k for k in given if getattr(learner.config, k) != getattr(config, k)):
        raise click.UsageError(
            f"{run} resumes from {loop.checkpoint_dir(run, done)}, whose config differs in "
            f"{', '.join(differ)}; give the options the run started with, or none"
        )
    return learner


def _weights_digest(learner) -> str:
    """sha256 of this rank's trained parameters (FSDP: its shards), in the optimizer's order."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for p in learner.params():
        t = p.detach()
        t = t.to_local() if hasattr(t, "to_local") else t
        h.update(t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@main.command("follow")
@click.argument("run", type=click.Path(file_okay=False, path_type=Path), callback=run_dir)
@click.option(
    "--algo",
    type=click.Choice(["grpo"]),
    default="grpo",
    show_default=True,
    help="Learner algorithm (GRPO only: PPO's GAE needs the critic's values before a batch is "
    "written, so its learner runs in the loop).",
)
@click.option(
    "--model",
    "model_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="HF model directory to start from, the loop's start policy (not needed once RUN has a "
    "completed step: its checkpoint is resumed).",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="TOML config ([grpo] table or flat keys); flags override it. Default: the loop's "
    "learner settings, published with its first batch.",
)
@click.option(
    "--steps",
    "n_steps",
    type=click.IntRange(min=1),
    required=True,
    help="Train the run's steps up to N - 1 (the completed ones are skipped), then exit.",
)
@click.option(
    "--wait-timeout",
    type=click.FloatRange(min=0),
    default=86400.0,
    show_default=True,
    help="Seconds to wait for each step's batch (RUN/steps/K/batch.json) before giving up.",
)
@click.option(
    "--weights-digest",
    is_flag=True,
    help="After the last step every rank logs the sha256 of its trained weights (under ddp "
    "they agree).",
)
@_config_options(("grpo",))
def follow_cmd(run, algo, model_dir, config_path, n_steps, wait_timeout, weights_digest, **flags):
    """Be the learner of a loop that runs elsewhere: train each step's batch as it is published.

    For each step K from RUN's completed steps to N - 1: wait until the loop has published
    K's batch (RUN/steps/K/samples.jsonl and then its marker batch.json;
    `examples/mix_harness_rl.py --learner follow` does it), update on it and write what
    `claw-rl train` writes (policy/vN, checkpoints/K, the policies.jsonl and metrics.jsonl
    rows, with the loop's fields) and the policy record on stdout; the loop waits for the
    row and reloads its engines. Resumes from RUN's last checkpoint. A failure is written
    to RUN/steps/K/learner-error, which stops the loop. Under torchrun (one node or several,
    RUN on a filesystem they share) every rank reads the batch; rank 0 writes. The learner
    settings (lr, epochs, ...) are the loop's, published with its first batch: a flag given
    must agree with them.

    Example:

    \b
        torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
          --rdzv-endpoint HEAD:29400 --rdzv-id rl $(which claw-rl) follow /shared/runs/mix \\
          --model /shared/models/M --steps 8
    """
    from claw_rl import loop
    from claw_rl._dist import from_rank0, init_from_env, shutdown
    from claw_rl.config import dump_toml
    from claw_rl.records import write_jsonl

    rank, world = init_from_env()  # a no-op outside torchrun
    done = 0
    if rank == 0:
        done = loop.drop_incomplete(run)
        (loop.step_dir(run, done) / loop.LEARNER_ERROR).unlink(missing_ok=True)  # a past try's
    done = from_rank0(done)
    try:
        learner = _start_learner(algo, run, model_dir, config_path, flags, done, wait_timeout)
    except Exception as exc:  # the loop waiting on step `done` stops at once
        loop.report_learner_error(run, done, f"rank {rank}: {type(exc).__name__}: {exc}")
        if isinstance(exc, ClawError):
            raise _fail(exc) from exc
        raise
    if rank == 0:  # RUN may not exist yet: the loop can start after its learner
        run.mkdir(parents=True, exist_ok=True)
        (run / "config.toml").write_text(dump_toml(learner.config, algo))
    current = loop.latest_policy(run)
    if current is None and model_dir is not None:  # the start policy, as the loop serves it
        current = {"schema": "claw.policy/v1", "name": learner.config.name,
                   "version": learner.version, "path": str(model_dir.resolve())}  # fmt: skip
    steps = loop.follow(learner, run, range(done, n_steps), timeout=wait_timeout, current=current)
    try:
        for row, policy in steps:
            if rank == 0:
                write_jsonl([policy], sys.stdout)
                click.echo(
                    f"step {row['step']}: loss {row.get('loss', 0):.4g} -> policy "
                    f"v{policy['version']} ({world} ranks)",
                    err=True,
                )
    except ClawError as exc:
        raise _fail(exc) from exc
    if weights_digest:
        click.echo(
            f"claw-rl follow: rank {rank}/{world}: weights sha256 {_weights_digest(learner)}",
            err=True,
        )
    shutdown()


@main.command("values")
@click.option(
    "--model",
    "model_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    required=True,
    help="Policy directory; its critic/ subdirectory holds the critic (fresh zero head if absent).",
)
@click.option(
    "--samples",
    "samples_path",
    default="-",
    show_default=True,
    callback=input_path,
    help="claw.sample/v1 JSONL file.",
)
@click.option(
    "-o",
    "--output",
    "out_path",
    default="-",
    show_default=True,
    callback=output_path,
    help="Values JSONL file.",
)
@click.option(
    "--critic",
    type=click.Choice(["auto", "head", "model"]),
    default="auto",
    show_default=True,
    help="Critic kind; auto = what MODEL/critic holds (head when there is none).",
)
@click.option(
    "--micro-batch-size", type=int, default=4, show_default=True, help="Samples per forward pass."
)
@click.option(
    "--routing-replay",
    type=click.Choice(["auto", "r3", "off"]),
    default="auto",
    show_default=True,
    help="MoE policy: r3 routes each token to the experts its sample's routing recorded (others "
    "live), off routes every token live; auto = r3 (a dense policy ignores it).",
)
def values_cmd(model_dir, samples_path, out_path, critic, micro_batch_size, routing_replay) -> None:
    """Critic values V(s_i) per packed token, for claw-tree's tree GAE.

    One line per sample: {"sample_id": ..., "values": [...]} aligned with its input_ids;
    V(s_i) is the value of the prefix before token i (0 for roots).

    Example:

    \b
        claw-rl values --model runs/rl/policy/v3 --samples s.jsonl > v.jsonl
        claw-tree samples --algo ppo --values v.jsonl calls.jsonl outcomes.jsonl > ppo.jsonl
    """
    from claw_rl.config import PPOConfig
    from claw_rl.critic import critic_kind
    from claw_rl.learner import Learner
    from claw_rl.records import read_samples, write_jsonl

    kind = critic if critic != "auto" else (critic_kind(model_dir) or "head")
    if critic_kind(model_dir) is None:
        click.echo(
            f"{model_dir}: no critic/ yet; using a fresh {kind} critic (values are 0)", err=True
        )
    try:
        samples = read_samples(samples_path)  # a bad file is reported before the model loads
        cfg = PPOConfig(
            critic=kind, micro_batch_size=micro_batch_size, routing_replay=routing_replay
        )
        learner = Learner.ppo(cfg, model_dir)
        rows = learner.values(samples)
    except ClawError as exc:
        raise _fail(exc) from exc
    with click.open_file(out_path, "w") as fh:
        write_jsonl(rows, fh)


@main.command("logprobs")
@click.option(
    "--model",
    "model_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    required=True,
    help="HF model directory the calls were (supposedly) sampled from.",
)
@click.option(
    "--calls",
    "calls_path",
    default="-",
    show_default=True,
    callback=input_path,
    help="claw.call/v1 JSONL file.",
)
@click.option(
    "-o",
    "--output",
    "out_path",
    default="-",
    show_default=True,
    callback=output_path,
    help="Per-call JSONL output.",
)
@click.option(
    "--mismatch-threshold",
    "threshold",
    type=float,
    default=0.1,
    show_default=True,
    help="Count tokens whose |learner - engine| logprob difference exceeds this.",
)
@click.option(
    "--temperature",
    type=click.FloatRange(min=0.0, min_open=True),
    default=None,
    help="Override: take every call's logprobs at this temperature instead of the one its "
    "'sampling' records (top_p / top_k stay as recorded). Default: each call's own.",
)
@click.option(
    "--routing-replay",
    type=click.Choice(["auto", "r3", "off"]),
    default="auto",
    show_default=True,
    help="MoE model: r3 routes each token to the experts the calls' routing recorded (a reused "
    "prefix's rows from its parent call; unrecorded tokens live), off routes every token live; "
    "auto = r3 (a dense model ignores it). The flip rate (live top-k vs recorded) is reported.",
)
def logprobs_cmd(model_dir, calls_path, out_path, threshold, temperature, routing_replay) -> None:
    """Recompute logprobs of recorded completions and compare them with the engine's.

    Each call's logprobs are taken under the settings it was sampled with (its 'sampling':
    temperature, top_k, top_p; absent = 1, 0, 1). One line per trainable call: call_id, session,
    seq, the learner's logprobs of the completion tokens and the mismatch (mean/max abs diff, KL
    estimates, fraction beyond --mismatch-threshold). Greedy tokens (temperature 0) have no distribution
    to compare with: left out of the mismatch, counted as "greedy". The summary over all calls
    goes to stderr (for an MoE model with it the routing: flip rate of the learner's live top-k
    against the recorded experts, recorded fraction, busiest expert's load). The engine's kept
    sets (completion_kept) are taken as recorded.

    Example:

        claw-rl logprobs --model runs/tiny --calls runs/calls.jsonl > mismatch.jsonl
    """
    from claw_rl.calls import compare, finish_mismatch, read_call_samples
    from claw_rl.config import GRPOConfig
    from claw_rl.learner import Learner
    from claw_rl.records import write_jsonl

    try:
        read = read_call_samples(calls_path, temperature=temperature)  # before the model
        pairs = read.pairs
        learner = Learner.grpo(GRPOConfig(routing_replay=routing_replay), model_dir)
        lps, routing = learner.logprobs_report([s for _, s in pairs])
    except ClawError as exc:
        raise _fail(exc) from exc
    if read.missing_parents:
        click.echo(
            f"claw-rl logprobs: {read.missing_parents} calls reuse a prefix whose "
            f"prefix.parent_call is not in {calls_path} (or has no routing): the learner routes "
            f"their {read.unrouted_tokens} tokens before routing.start itself",
            err=True,
        )
        routing["routing_missing_parents"] = read.missing_parents
        routing["routing_unrouted_tokens"] = read.unrouted_tokens
    if learner.replay is None and any(s.routing is not None for _, s in pairs):
        click.echo(
            f"claw-rl logprobs: {model_dir} is dense: the calls' routing is unused", err=True
        )
    total = {
        "n": 0.0,
        "abs_sum": 0.0,
        "abs_max": 0.0,
        "k1_sum": 0.0,
        "k3_sum": 0.0,
        "beyond": 0.0,
        "greedy": 0.0,
    }
    with click.open_file(out_path, "w") as fh:
        for (row, s), lp in zip(pairs, lps, strict=True):
            st = compare(s, lp, threshold)
            for k in total:
                total[k] = max(total[k], st[k]) if k == "abs_max" else total[k] + st[k]
            n_p = len(row["prompt_ids"])
            write_jsonl(
                [
                    {
                        "call_id": row["call_id"],
                        "session": row.get("session"),
                        "seq": row.get("seq"),
                        "logprobs": lp[n_p:],
                        "mismatch": finish_mismatch(st),
                        "greedy": int(st["greedy"]),
                    }
                ],
                fh,
            )
    click.echo(
        json.dumps(
            {
                "calls": len(pairs),
                **finish_mismatch(total),
                "greedy_tokens": int(total["greedy"]),
                **routing,
            }
        ),
        err=True,
    )


if __name__ == "__main__":
    main()
