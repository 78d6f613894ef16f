"""One frozen config class per algorithm; each field is a CLI flag and a TOML key.

The fields every learner shares are declared once: :class:`TrainConfig` (optimizer, batching,
runtime) and :class:`RLConfig` (mismatch and staleness checks, clipped surrogate, entropy,
training-inference correction); :class:`GRPOConfig` and :class:`PPOConfig` add only their own,
:class:`SFTConfig` nothing.

There is no temperature setting: the learner takes each token's logprob under the sampling
settings recorded with it (claw.sample/v1 ``temperatures`` / ``top_ps`` / ``top_ks``).

``claw-rl train --algo grpo --lr 1e-5`` sets ``GRPOConfig.lr``; ``--config run.toml`` reads
the same keys (flags win). Every run writes its resolved config as ``config.toml``.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any, ClassVar, Self

import attrs

from claw_rl.errors import ConfigError


def _f(default: Any, help: str, choices: tuple | None = None) -> Any:
    return attrs.field(default=default, metadata={"help": help, "choices": choices})


IS_CHOICES = ("tis", "mis_token", "mis_sequence", "none")
KL_CHOICES = ("k3", "k2")
AGG_CHOICES = ("weights", "token_mean", "constant")
ROUTING_CHOICES = ("auto", "r3", "r2", "off")
MAX_EPOCHS = 1000  # passes over one batch; SFT runs use tens, PPO a few
# AdamW moves a weight by about lr per step (by lr * gradient / adam_eps when adam_eps dominates,
# as the gradient-equivalence tests set it, with lr up to 10); beyond that no lr trains a policy
MAX_LR = 10.0


def _in_range(config: object, name: str, low: float, high: float, *, low_open: bool) -> None:
    """Refuse ``config.<name>`` unless it is a finite number in ``(low, high]`` (``low_open``)
    or ``[low, high]``, naming the field: a NaN or huge learner setting trains a NaN or wrecked
    policy while every step looks normal."""
    val = getattr(config, name)
    number = isinstance(val, int | float) and not isinstance(val, bool)
    ok = number and math.isfinite(val) and (val > low if low_open else val >= low) and val <= high
    if not ok:
        lo = f"{'>' if low_open else '>='} {low:g}"
        hi = f" and <= {high:g}" if math.isfinite(high) else ""
        raise ConfigError(f"{name} = {val!r} must be a finite number {lo}{hi}")


def _int_in_range(config: object, name: str, low: int, high: int | None = None) -> None:
    val = getattr(config, name)
    if not isinstance(val, int) or isinstance(val, bool) or val < low or (high and val > high):
        bound = f">= {low}" + (f" and <= {high}" if high else "")
        raise ConfigError(f"{name} = {val!r} must be an integer {bound}")


@attrs.frozen(kw_only=True)
class TrainConfig:
    """Fields every learner shares: optimizer, batching and runtime.

    Every number is range-checked where a config is built (constructor, TOML, flags, a
    checkpoint's ``state.json``, the settings a loop publishes to ``claw-rl follow``), and a
    value out of range is a :class:`ConfigError` naming the field. Floats must be finite;
    ``0 < lr <= 10`` (``MAX_LR``; also PPO's ``critic_lr``): AdamW moves a weight by about lr
    per step, by lr * gradient / adam_eps when adam_eps dominates; ``0 <= weight_decay <= 1 /
    lr`` (AdamW's decay factor ``1 - lr * wd`` stays in [0, 1]); ``0 < adam_eps <= 1``; ``0 <=
    adam_beta1, adam_beta2 < 1``; ``max_grad_norm >= 0``; ``1 <= epochs <= 1000``
    (``MAX_EPOCHS``); ``minibatches``,
    ``micro_batch_size`` >= 1; the RL coefficients (``clip_eps_*``, ``entropy_coef``,
    ``kl_coef``, ``vf_coef``, ``value_clip``, ``whiten_std_floor``, ``mismatch_threshold``)
    >= 0, with ``clip_eps_low <= 1``; ``max_staleness >= 0``; ``moe_aux_loss >= 0``.
    """

    algo: ClassVar[str] = ""

    name: str = _f("policy", "policy name written into claw.policy/v1 records")
    lr: float = _f(1e-6, "AdamW learning rate (of the policy; PPO's critic has critic_lr)")
    weight_decay: float = _f(0.0, "AdamW weight decay")
    adam_beta1: float = _f(0.9, "AdamW beta1")
    adam_beta2: float = _f(0.999, "AdamW beta2")
    adam_eps: float = _f(1e-8, "AdamW epsilon")
    max_grad_norm: float = _f(1.0, "clip the global gradient norm to this (0 = no clipping)")
    warmup_steps: int = _f(
        0,
        "linear learning-rate warmup over the first N optimizer steps (0 = none): AdamW's first "
        "steps move every weight by about lr, which can break a fine-tuned policy",
    )
    decay_steps: int = _f(
        0,
        "linear learning-rate decay to 0 at optimizer step N (0 = constant lr): step k runs at "
        "lr * (N - k + 1) / N, as transformers' linear schedule, and steps past N at 0; with "
        "warmup_steps the two factors multiply. For a fixed run such as SFT: epochs x minibatches",
    )
    epochs: int = _f(1, "passes over each batch (PPO epochs)")
    minibatches: int = _f(1, "optimizer steps per epoch; the batch's samples are split evenly")
    micro_batch_size: int = _f(4, "samples per forward pass (gradient accumulation, memory only)")
    dtype: str = _f("float32", "parameter dtype: float32, bfloat16, float16")
    seed: int = _f(0, "seed for minibatch shuffling and initialisation (PPO: the value head)")
    parallelism: str = _f(
        "ddp",
        "under torchrun: ddp (whole model on every rank) or fsdp (parameters, "
        "gradients and optimizer state sharded with FSDP2)",
        ("ddp", "fsdp"),
    )
    lora_rank: int = _f(
        0,
        "train a LoRA adapter of this rank (peft; pip install 'claw-rl[lora]') on the frozen "
        "model instead of every weight; policies are then PEFT adapter directories (0 = full "
        "fine-tuning)",
    )
    lora_alpha: int = _f(
        16, "LoRA scaling numerator: the adapter's update is scaled by alpha / rank"
    )
    lora_targets: str = _f(
        "all-linear",
        "modules that get an adapter: all-linear (every linear layer but the LM head) or "
        "comma-separated module names (q_proj,v_proj)",
    )
    routing_replay: str = _f(
        "auto",
        "MoE expert routing in the learner's passes: r3 (each token's experts as the engine "
        "recorded them, the samples' routing; unrecorded tokens as r2), r2 (every pass of a step "
        "replays the experts the step's first pass chose), off (live top-k in every pass), auto "
        "(r3 for an MoE model; nothing for a dense one)",
        ROUTING_CHOICES,
    )
    moe_aux_loss: float = _f(
        0.0,
        "coefficient of the load-balancing auxiliary loss of an MoE model (Qwen3-MoE's "
        "router_aux_loss_coef; 0 = off), added to the policy loss",
    )

    def __attrs_post_init__(self) -> None:
        if self.lora_rank < 0 or self.lora_alpha <= 0:
            raise ConfigError(
                f"lora_rank = {self.lora_rank!r} must be >= 0 and lora_alpha = "
                f"{self.lora_alpha!r} > 0"
            )
        if self.lora_rank and not self.lora_targets.strip(" ,"):
            raise ConfigError("lora_targets is empty; name the modules or use all-linear")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype = {self.dtype!r}; choose float32, bfloat16 or float16")
        # ranges (see the class docstring); adam_eps > 0 keeps 0 / sqrt(0) out of the update
        _in_range(self, "lr", 0.0, MAX_LR, low_open=True)
        _in_range(self, "weight_decay", 0.0, 1.0 / self.lr, low_open=False)
        _in_range(self, "adam_eps", 0.0, 1.0, low_open=True)
        _in_range(self, "max_grad_norm", 0.0, math.inf, low_open=False)
        for name in ("adam_beta1", "adam_beta2"):
            val = getattr(self, name)
            if not (isinstance(val, int | float) and 0 <= val < 1):
                raise ConfigError(f"{name} = {val!r} must be a number >= 0 and < 1")
        _int_in_range(self, "epochs", 1, MAX_EPOCHS)
        for name in ("micro_batch_size", "minibatches"):
            _int_in_range(self, name, 1)
        for name in ("warmup_steps", "decay_steps"):
            _int_in_range(self, name, 0)
        if self.parallelism not in ("ddp", "fsdp"):
            raise ConfigError(f"parallelism = {self.parallelism!r}; choose ddp or fsdp")
        if self.routing_replay not in ROUTING_CHOICES:
            raise ConfigError(
                f"routing_replay = {self.routing_replay!r}; choose {', '.join(ROUTING_CHOICES)}"
            )
        _in_range(self, "moe_aux_loss", 0.0, math.inf, low_open=False)

    @classmethod
    def from_dict(cls, d: dict, where: str = "config") -> Self:
        return _from_dict(cls, d, where)

    def to_dict(self) -> dict:
        return attrs.asdict(self)


@attrs.frozen(kw_only=True)
class RLConfig(TrainConfig):
    """What GRPO and PPO add to :class:`TrainConfig`: training-inference mismatch and staleness
    checks, the clipped surrogate, the entropy bonus and the correction."""

    mismatch_threshold: float = _f(
        0.1, "report the fraction of tokens with |logprob diff| above this"
    )
    max_staleness: int = _f(1, "samples older than learner version - this are stale (reported)")
    drop_stale: bool = _f(False, "drop stale samples instead of training on them")
    clip_eps_low: float = _f(0.2, "ratio clip below: r >= 1 - eps_low")
    clip_eps_high: float = _f(0.2, "ratio clip above: r <= 1 + eps_high (DAPO clip-higher: 0.28)")
    entropy_coef: float = _f(0.0, "entropy bonus weight")
    is_correction: str = _f(
        "tis", "training-inference correction: tis, mis_token, mis_sequence, none", IS_CHOICES
    )
    is_cap: float = _f(2.0, "TIS truncation C / MIS upper bound on pi_old / pi_engine")
    is_min: float = _f(0.5, "MIS lower bound on pi_old / pi_engine")
    mis_seq_tol: float = _f(
        0.01,
        "mis_sequence keeps a path when its geometric-mean pi_old / pi_engine "
        "lies in [exp(-tol), exp(tol)] (0.01: [0.990, 1.010])",
    )

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if self.is_correction not in IS_CHOICES:
            raise ConfigError(
                f"is_correction = {self.is_correction!r}; choose one of {', '.join(IS_CHOICES)}"
            )
        _in_range(self, "is_cap", 0.0, math.inf, low_open=True)
        if not 0 < self.is_min <= 1 <= self.is_cap:
            raise ConfigError(
                f"need 0 < is_min <= 1 <= is_cap, got is_min={self.is_min}, is_cap={self.is_cap}"
            )
        _in_range(self, "clip_eps_low", 0.0, 1.0, low_open=False)  # r >= 1 - eps_low >= 0
        _in_range(self, "clip_eps_high", 0.0, math.inf, low_open=False)
        _in_range(self, "mis_seq_tol", 0.0, math.inf, low_open=True)
        _in_range(self, "mismatch_threshold", 0.0, math.inf, low_open=False)
        _in_range(self, "entropy_coef", 0.0, math.inf, low_open=False)
        _int_in_range(self, "max_staleness", 0)


@attrs.frozen(kw_only=True)
class GRPOConfig(RLConfig):
    """Critic-free learner: clipped policy gradient with the samples' advantages and weights."""

    algo: ClassVar[str] = "grpo"

    loss_agg: str = _f(
        "weights",
        "token loss aggregation: weights (claw-tree loss weights, exact "
        "per-trajectory mean), token_mean (DAPO), constant (Dr. GRPO)",
        AGG_CHOICES,
    )
    constant_len: int = _f(1024, "Dr. GRPO's fixed length for loss_agg=constant")
    kl_coef: float = _f(
        0.0, "weight of the KL penalty to the reference model (0 = off, no ref model)"
    )
    kl_estimator: str = _f(
        "k3",
        "KL(pi || ref) penalty: k3 (value k3, gradient of the reverse KL) or k2 "
        "(0.5 (log pi - log ref)^2, the same gradient); k1 is refused (zero expected "
        "gradient as a loss)",
        KL_CHOICES,
    )
    ref_model: str = _f(
        "", "reference model directory for the KL term (default: the initial model)"
    )

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if self.loss_agg not in AGG_CHOICES:
            raise ConfigError(
                f"loss_agg = {self.loss_agg!r}; choose weights, token_mean or constant"
            )
        if self.kl_estimator == "k1":
            raise ConfigError(
                "kl_estimator = 'k1': log pi - log ref used as a loss has zero expected gradient "
                "(E_pi[grad log pi] = 0), so the penalty would do nothing; choose k3 or k2"
            )
        if self.kl_estimator not in KL_CHOICES:
            raise ConfigError(
                f"kl_estimator = {self.kl_estimator!r}; choose {' or '.join(KL_CHOICES)}"
            )
        _in_range(self, "kl_coef", 0.0, math.inf, low_open=False)
        _int_in_range(self, "constant_len", 1)


@attrs.frozen(kw_only=True)
class PPOConfig(RLConfig):
    """PPO with a critic: clipped policy loss on the samples' advantages plus a clipped value
    loss on their returns. The critic is a value head on the policy or a separate model."""

    algo: ClassVar[str] = "ppo"

    epochs: int = _f(2, "passes over each batch (PPO epochs)")
    minibatches: int = _f(2, "optimizer steps per epoch; the batch's samples are split evenly")
    critic_lr: float = _f(1e-5, "AdamW learning rate of the value head / critic model")
    critic: str = _f(
        "head",
        "critic kind: head (value head on the policy) or model (separate model)",
        ("head", "model"),
    )
    critic_model: str = _f("", "critic backbone directory for critic=model (default: the policy's)")
    whiten_advantages: bool = _f(
        True,
        "whiten the advantages over the batch's trainable tokens (mean 0, std 1, "
        "weighted like the loss); a terminal reward then moves every token",
    )
    whiten_std_floor: float = _f(
        0.1,
        "whitening divides by max(std, this): a batch whose advantages barely differ (rewards "
        "nearly all equal) is amplified at most 1/floor times, not to std 1. 0.1 suits rewards "
        "in [0, 1]: the std of a 0/1 reward at 99% success, a third of a mixed batch's",
    )
    whiten_center: bool = _f(
        True,
        "whitening subtracts the batch mean (standard PPO); false: divides by the std only, so "
        "every advantage keeps its critic-given sign (in a batch that nearly all passes, "
        "centring makes the confidently right tokens' small positive advantages negative)",
    )
    vf_coef: float = _f(0.5, "weight of the value loss")
    value_clip: float = _f(0.2, "value clip range around the old values (0 = no clipping)")

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if self.critic not in ("head", "model"):
            raise ConfigError(f"critic = {self.critic!r}; choose head or model")
        _in_range(self, "critic_lr", 0.0, MAX_LR, low_open=True)
        _in_range(self, "whiten_std_floor", 0.0, math.inf, low_open=False)
        _in_range(self, "vf_coef", 0.0, math.inf, low_open=False)
        _in_range(self, "value_clip", 0.0, math.inf, low_open=False)


@attrs.frozen(kw_only=True)
class SFTConfig(TrainConfig):
    """Supervised fine-tuning on tree-packed samples (``algo: sft``): the loss-weighted mean NLL
    of the trainable tokens at temperature 1; nothing beyond :class:`TrainConfig`."""

    algo: ClassVar[str] = "sft"


CONFIGS: dict[str, type[TrainConfig]] = {"grpo": GRPOConfig, "ppo": PPOConfig, "sft": SFTConfig}


def _from_dict(cls: type, d: dict, where: str) -> Any:
    fields = attrs.fields_dict(cls)
    kw = {}
    for key, val in d.items():
        if key == "temperature" and key not in fields:
            raise ConfigError(
                f"{where}: 'temperature' is no longer a learner setting: each token's logprob is "
                "taken under the temperature / top_p / top_k its call was sampled with (the "
                "samples' temperatures / top_ps / top_ks, from claw.call/v1 sampling); remove it"
            )
        if key not in fields:
            raise ConfigError(
                f"{where}: unknown key {key!r} for {cls.__name__} (known: {', '.join(fields)})"
            )
        typ = type(fields[key].default)
        if typ is float and isinstance(val, int) and not isinstance(val, bool):
            val = float(val)
        if not isinstance(val, typ) or (typ is not bool and isinstance(val, bool)):
            raise ConfigError(f"{where}: {key} = {val!r} must be a {typ.__name__}")
        kw[key] = val
    try:
        return cls(**kw)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def load_toml(path: str | Path) -> dict:
    """Read a TOML config file (flat table, or keys under ``[grpo]`` / ``[ppo]``)."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML ({exc})") from exc


def dump_toml(config: TrainConfig, algo: str) -> str:
    """The resolved config as TOML, each key with its help as a comment."""
    lines = [f"# resolved claw-rl config (algo = {algo})", f"[{algo}]"]
    for f in attrs.fields(type(config)):
        val = getattr(config, f.name)
        if isinstance(val, bool):
            text = "true" if val else "false"
        elif isinstance(val, str):
            text = '"' + val.replace("\\", "\\\\").replace('"', '\\"') + '"'
        else:
            text = repr(val)
        lines.append(f"# {f.metadata['help']}")
        lines.append(f"{f.name} = {text}")
    return "\n".join(lines) + "\n"


def config_from_toml(path: str | Path, algo: str) -> dict:
    """Keys for ``algo`` from a TOML file: the ``[algo]`` table if present, else the top level."""
    data = load_toml(path)
    if algo in data and isinstance(data[algo], dict):
        return data[algo]
    other = [k for k in data if isinstance(data[k], dict)]
    if other:
        raise ConfigError(f"{path}: no [{algo}] table (found [{'], ['.join(other)}])")
    return data
