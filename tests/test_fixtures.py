"""The committed tiny model fixture is exactly what `claw-rl init-tiny` writes today."""

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
        assert (tmp_path / "tiny" / name).read_bytes() == (FIXTURE / name).read_bytes(), name
