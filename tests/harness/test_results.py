"""The results file the harness tests write and the HARNESSES.md table rendered from it."""

from __future__ import annotations

import json
import tempfile

import pytest
from _results import ROOT, load, record, render


def test_record_merges_cases_and_hides_machine_paths(tmp_path):
    """A case's latest run replaces its entry, other cases stay, machine paths become placeholders."""
    path = tmp_path / "results.json"
    record("codex", {"passed": False, "where": str(ROOT / "x")}, path)
    record("mini-swe-agent", {"passed": True, "where": tempfile.gettempdir() + "/run"}, path)
    record("codex", {"passed": True, "where": str(ROOT / "y")}, path)
    cases = load(path)["cases"]
    assert sorted(cases) == ["codex", "mini-swe-agent"]
    assert cases["codex"]["passed"] is True and cases["codex"]["where"] == "<repo>/y"
    assert cases["mini-swe-agent"]["where"] == "<tmp>/run"
    assert str(ROOT) not in path.read_text()


def test_render_shows_versions_skips_and_failures():
    """Rows carry version, API, streaming, tool calls, sub-agents and pass/FAIL/skip with the reason."""
    data = {
        "cases": {
            "claude-code-subagent": {
                "label": "Claude Code, sub-agent",
                "version": "2.1.0",
                "api": "Anthropic Messages",
                "streaming": True,
                "tool_calls": 2,
                "subagent_branches": 1,
                "passed": True,
                "requests": 4,
                "calls": 4,
                "seconds": 20.0,
                "backend": "bwrap",
                "drift": {"extends": 2, "edited": 0, "rerender_differs": 0, "output_branches": 0},
                "recorded_at": "2026-12-02T22:00:00Z",
            },
            "codex": {
                "label": "Codex CLI",
                "version": "0.1",
                "api": "OpenAI Responses",
                "streaming": True,
                "tool_calls": 1,
                "passed": False,
                "requests": 2,
                "calls": 1,
                "seconds": 5.0,
            },
            "mini-swe-agent": {
                "label": "mini-swe-agent",
                "api": "OpenAI chat",
                "skipped": "mini is not installed",
            },
        }
    }
    text = render(data)
    assert (
        "| Claude Code, sub-agent | 2.1.0 | Anthropic Messages | yes | 2 executed | yes (1 branch) | pass (4 requests"
        in text
    )
    assert (
        "| Codex CLI | 0.1 | OpenAI Responses | yes | 1 executed | - | FAIL (2 requests, 1 records"
        in text
    )
    assert "skipped: mini is not installed" in text
    assert "| Claude Code, sub-agent | 2 | 0 | 0 | 0 |" in text
    assert "Recorded 2026-12-02; sandbox backend: bwrap." in text


def test_load_names_the_file_of_a_bad_results_file(tmp_path):
    """A results file that is not JSON, or has no cases object, is refused with its path."""
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        load(bad)
    bad.write_text(json.dumps({"cases": []}))
    with pytest.raises(ValueError, match="field 'cases'"):
        load(bad)
