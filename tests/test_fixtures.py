"""The committed tiny model fixture is exactly what `claw-rl init-tiny` writes today."""

import json
from pathlib import Path

from claw_rl.cli import main as claw_rl
from click.testing import CliRunner

FIXTURE = Path(__file__).parent / "fixtures" / "tiny-qwen3"


def test_fixture_matches_init_tiny(tmp_path):
    """Regenerating the fixture with the CLI gives byte-identical files."""
    result = CliRunner().invoke(claw_rl, ["init-tiny", str(tmp_path / "tiny")])
    assert result.exit_code == 0, result.output
    made = sorted(p.name for p in (tmp_path / "tiny").iterdir())
    assert made == sorted(p.name for p in FIXTURE.iterdir())
    for name in made:
        new, old = (tmp_path / "tiny" / name).read_bytes(), (FIXTURE / name).read_bytes()
        if name.endswith(".json") and b"transformers_version" in old:
            # transformers stamps its own version into these files; a newer
            # release on a fresh machine must not fail the fixture.
            new, old = _unstamped(new), _unstamped(old)
        assert new == old, name


def _unstamped(raw: bytes) -> dict:
    data = json.loads(raw)
    data.pop("transformers_version", None)
    return data
