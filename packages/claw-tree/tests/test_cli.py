"""Every command of the CLI answers --help; --version prints the package version."""

import click
import pytest
from claw_tree import __version__
from claw_tree.cli import main
from click.testing import CliRunner


def _commands(group: click.Group, prefix: tuple[str, ...] = ()):
    for name, cmd in group.commands.items():
        yield (*prefix, name), cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*prefix, name))


def test_version():
    """--version prints the installed version."""
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert __version__ in result.output


def test_every_command_has_help_with_example():
    """Each command's --help works and its help text shows an Example."""
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for path, cmd in _commands(main):
        result = CliRunner().invoke(main, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        if not isinstance(cmd, click.Group):
            assert "Example" in (cmd.help or ""), f"{' '.join(path)} has no Example in its help"


# --- the commands end to end --------------------------------------------------------------

import json  # noqa: E402

from tree_testlib import call, outcome  # noqa: E402


def _files(tmp_path):
    calls = [
        call("a", 0, [1, 2], [3, 4], prefix={"reused_tokens": 0, "rendered_tokens": 2}),
        call(
            "a",
            1,
            [1, 2, 3, 4, 5],
            [6],
            prefix={"reused_tokens": 4, "rendered_tokens": 1, "fresh_render_matches": False},
        ),
        call("a", 2, [1, 2, 3, 9], [7]),  # diverges inside call 0's output
        call("b", 0, [1, 2], [8]),
        call("c", 0, [1, 2], [8]),
    ]
    outcomes = [outcome("a", 1.0), outcome("b", 0.0), outcome("c", 0.0, status="infra_error")]
    cpath, opath = tmp_path / "calls.jsonl", tmp_path / "outcomes.jsonl"
    cpath.write_text("".join(json.dumps(c) + "\n" for c in calls))
    opath.write_text("".join(json.dumps(o) + "\n" for o in outcomes))
    return cpath, opath


def test_stats_json_has_the_dashboard_keys(tmp_path):
    """`stats --json` prints one JSON object with the promised keys and the drift counters."""
    cpath, _ = _files(tmp_path)
    result = CliRunner().invoke(main, ["stats", "--json", str(cpath)])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)
    for key in (
        "sessions",
        "calls",
        "flat_tokens",
        "tree_tokens",
        "tree_token_ratio",
        "trainable_tokens",
        "branches",
    ):
        assert key in stats
    assert stats["sessions"] == 3 and stats["calls"] == 5
    assert stats["flat_tokens"] == 4 + 6 + 5 + 3 + 3
    assert stats["tree_tokens"] == 6 + 2 + 3 + 3
    assert stats["branches"] == 1 and stats["branch_reasons"]["output"] == 1
    assert stats["calls_reusing_prefix"] == 1 and stats["false_forks_avoided"] == 1


def test_build_reads_stdin_and_prints_trajectories(tmp_path):
    """`build` from stdin prints one JSON line per trajectory with spans and calls."""
    cpath, _ = _files(tmp_path)
    result = CliRunner().invoke(main, ["build"], input=cpath.read_text())
    assert result.exit_code == 0, result.output
    rows = [json.loads(x) for x in result.stdout.splitlines()]
    assert [(r["session"], r["calls"]) for r in rows] == [
        ("a", ["a-c0", "a-c1"]),
        ("a", ["a-c2"]),
        ("b", ["b-c0"]),
        ("c", ["c-c0"]),
    ]


def test_samples_command_writes_valid_lines_and_reports_exclusions(tmp_path):
    """`samples` writes claw.sample/v1 lines and names the excluded rollout on stderr."""
    cpath, opath = _files(tmp_path)
    result = CliRunner().invoke(
        main,
        ["samples", str(cpath), "--outcomes", str(opath), "--algo", "grpo", "--id-prefix", "step7"],
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(x) for x in result.stdout.splitlines()]
    assert [r["sessions"] for r in rows] == [["a"], ["b"]]
    assert [r["sample_id"] for r in rows] == ["step7-0", "step7-1"]
    packed = CliRunner().invoke(
        main,
        [
            "samples",
            str(cpath),
            "--outcomes",
            str(opath),
            "--max-tokens",
            "100",
            "--path-weighting",
            "path",
        ],
    )
    assert [json.loads(x)["sessions"] for x in packed.stdout.splitlines()] == [["a", "b"]]
    assert "excluded c: status infra_error" in result.stderr
    assert sum(sum(r["loss_weights"]) for r in rows) == pytest.approx(
        1.0
    )  # one batch's weights sum to 1


def test_ppo_two_step_flow_with_values_file(tmp_path):
    """PPO: samples without values, a values file keyed by sample_id, then samples with values."""
    cpath, opath = _files(tmp_path)
    first = CliRunner().invoke(
        main, ["samples", str(cpath), "--outcomes", str(opath), "--algo", "ppo"]
    )
    assert first.exit_code == 0, first.output
    rows = [json.loads(x) for x in first.stdout.splitlines()]
    vpath = tmp_path / "values.jsonl"
    vpath.write_text(
        "".join(
            json.dumps({"sample_id": r["sample_id"], "values": [0.5] * len(r["input_ids"])}) + "\n"
            for r in rows
        )
    )
    second = CliRunner().invoke(
        main,
        [
            "samples",
            "--algo",
            "ppo",
            "--values",
            str(vpath),
            "--lam",
            "1.0",
            str(cpath),
            str(opath),
        ],
    )
    assert second.exit_code == 0, second.output
    out = [json.loads(x) for x in second.stdout.splitlines()]
    b = out[1]
    assert b["advantages"][-1] == -0.5 and b["returns"][-1] == 0.0
    bad = tmp_path / "short.jsonl"
    bad.write_text(json.dumps({"sample_id": rows[0]["sample_id"], "values": [0.0]}) + "\n")
    third = CliRunner().invoke(
        main,
        ["samples", str(cpath), "--outcomes", str(opath), "--algo", "ppo", "--values", str(bad)],
    )
    assert third.exit_code != 0 and "values do not match" in third.output
    twice = CliRunner().invoke(main, ["samples", str(cpath), str(opath), "--outcomes", str(opath)])
    assert twice.exit_code != 0 and "give the outcomes once" in twice.output


def test_show_prints_branches_and_decoded_text(tmp_path):
    """`show` renders segments, the branch point and leaves; --tokenizer decodes byte-level BPE."""
    cpath, _ = _files(tmp_path)
    tok = tmp_path / "tok"
    tok.mkdir()
    vocab = {"<s>": 0, "Ġa": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6, "g": 7, "h": 8, "Ġx": 9}
    (tok / "tokenizer.json").write_text(
        json.dumps(
            {
                "model": {"type": "BPE", "vocab": vocab, "merges": []},
                "added_tokens": [  # every field: newer tokenizers refuse a token without them
                    {
                        "id": 0,
                        "content": "<s>",
                        "single_word": False,
                        "lstrip": False,
                        "rstrip": False,
                        "normalized": False,
                        "special": True,
                    }  # fmt: skip
                ],
                "decoder": {
                    "type": "ByteLevel",
                    "add_prefix_space": False,
                    "trim_offsets": True,
                    "use_regex": True,
                },
            }
        )
    )
    result = CliRunner().invoke(main, ["show", "a", str(cpath), "--tokenizer", str(tok)])
    assert result.exit_code == 0, result.output
    assert "branches into 2" in result.stdout
    assert "leaf: trajectory 0, calls a-c0, a-c1" in result.stdout
    assert 'context 2 tok: " ab"' in result.stdout  # [1, 2] decodes to " ab"
    assert 'a-c0 output 1 tok: "c"' in result.stdout
    missing = CliRunner().invoke(main, ["show", "zz", str(cpath)])
    assert missing.exit_code != 0 and "'zz' not in the forest" in missing.output


def test_bad_line_fails_with_location_and_skip_invalid_reports(tmp_path):
    """A bad line fails naming file:line; --skip-invalid continues and says what it skipped."""
    cpath, _ = _files(tmp_path)
    cpath.write_text(cpath.read_text() + '{"schema": "claw.call/v9"}\n')
    result = CliRunner().invoke(main, ["stats", str(cpath)])
    assert result.exit_code != 0 and "calls.jsonl:6: schema: unsupported version" in result.output
    result = CliRunner().invoke(main, ["stats", "--skip-invalid", "--json", str(cpath)])
    assert result.exit_code == 0
    assert "skipped 1 invalid call line(s)" in result.stderr
    assert json.loads(result.stdout)["calls"] == 5


def test_stats_counts_every_shard_of_a_record_series(tmp_path):
    """`claw-tree stats calls.jsonl` counts the calls of calls.00001.jsonl too."""
    import json

    from tree_testlib import call

    (tmp_path / "calls.jsonl").write_text(json.dumps(call("s", 0, [1], [2])) + "\n")
    (tmp_path / "calls.00001.jsonl").write_text(json.dumps(call("s", 1, [1, 2], [3])) + "\n")
    result = CliRunner().invoke(main, ["stats", "--json", str(tmp_path / "calls.jsonl")])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["calls"] == 2


def test_the_gae_defaults_are_one_truth():
    """PPO's GAE defaults (level token, gamma = lambda = 1) are the same in the equations, the
    library calls, `claw-tree samples --help` and the README's PPO paragraph."""
    import inspect
    import re
    from pathlib import Path

    from claw_tree import advantages, build_samples, gae_for_samples, gae_on_tree, turn_gae_on_tree

    want = {"gae_level": advantages.GAE_LEVEL, "gamma": advantages.GAMMA, "lam": advantages.LAM}
    assert want == {"gae_level": "token", "gamma": 1.0, "lam": 1.0}
    for fn in (build_samples, gae_for_samples, gae_on_tree, turn_gae_on_tree):
        params = inspect.signature(fn).parameters
        assert {k: params[k].default for k in want if k in params} == {
            k: v for k, v in want.items() if k in params
        }, fn.__name__
    options = {p.name: p.default for p in main.commands["samples"].params}
    assert {k: options[k] for k in want} == want
    helped = CliRunner().invoke(main, ["samples", "--help"], terminal_width=200).output
    assert re.search(r"--gae-level \[token\|turn\].*default: token", helped.replace("\n", " "))
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    stated = re.search(
        r"Defaults: `--gae-level (\w+)`.*?gamma = lambda = (\d+)", readme.replace("\n", " ")
    )
    assert stated, "the README's PPO paragraph states the GAE defaults"
    assert (stated.group(1), float(stated.group(2))) == (want["gae_level"], want["lam"])
    assert want["gamma"] == want["lam"]  # the README states one value for both
