"""Config classes: validation, TOML round trip, one flag per field."""

from __future__ import annotations

import attrs
import pytest
from claw_rl import ConfigError, GRPOConfig, PPOConfig
from claw_rl.cli import main
from claw_rl.config import config_from_toml, dump_toml
from click.testing import CliRunner


@pytest.mark.parametrize("cls", [GRPOConfig, PPOConfig])
def test_toml_round_trip_and_size(tmp_path, cls):
    """dump_toml -> config_from_toml gives the same config; at most ~38 documented fields (33 +
    the three LoRA and two MoE fields every learner shares)."""
    algo = "grpo" if cls is GRPOConfig else "ppo"
    cfg = cls(lr=3e-5, name="x y", drop_stale=True, is_correction="mis_sequence")
    path = tmp_path / "c.toml"
    path.write_text(dump_toml(cfg, algo))
    assert cls.from_dict(config_from_toml(path, algo)) == cfg
    fields = attrs.fields(cls)
    assert len(fields) <= 38 and all(f.metadata["help"] for f in fields)


def test_every_field_is_a_train_flag():
    """Each field of both configs appears as --flag in `claw-rl train --help`."""
    out = CliRunner().invoke(main, ["train", "--help"]).output
    for cls in (GRPOConfig, PPOConfig):
        for f in attrs.fields(cls):
            assert "--" + f.name.replace("_", "-") in out, f.name


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"is_correction": "magic"}, "is_correction"),
        ({"lr": 0.0}, "lr"),
        ({"is_min": 2.0}, "is_min"),
        ({"loss_agg": "sum"}, "loss_agg"),
        ({"dtype": "int8"}, "dtype"),
        ({"mis_seq_tol": 0.0}, "mis_seq_tol"),
        ({"kl_estimator": "k1"}, "k1.*zero expected gradient"),
        ({"kl_estimator": "k4"}, "kl_estimator"),
    ],
)
def test_invalid_values(kw, message):
    """Invalid values raise ConfigError naming the field."""
    with pytest.raises(ConfigError, match=message):
        GRPOConfig(**kw)


def test_from_dict_errors(tmp_path):
    """Unknown keys and wrong types are named; a TOML without the algo's table is refused."""
    with pytest.raises(ConfigError, match="unknown key 'critic'"):
        GRPOConfig.from_dict({"critic": "head"})
    with pytest.raises(ConfigError, match="epochs = 'two' must be a int"):
        PPOConfig.from_dict({"epochs": "two"})
    p = tmp_path / "c.toml"
    p.write_text("[ppo]\nlr = 1e-5\n")
    with pytest.raises(ConfigError, match=r"no \[grpo\] table"):
        config_from_toml(p, "grpo")
