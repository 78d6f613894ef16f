"""Render packages/claw-proxy/HARNESSES.md from harness conformance results.

    python tests/harness/render_table.py                  # re-render from tests/harness/results.json
    python tests/harness/render_table.py --from .tools/harness-results.json
                                                          # take a fresh run's results, then render

`--from FILE` merges that run's cases into tests/harness/results.json (a case of the new run
replaces the old entry) before rendering, so a partial run keeps the other rows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import COMMITTED, TABLE, load, render  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--from", dest="source", type=Path, help="results file of a run to merge in first"
    )
    ap.add_argument(
        "--check", action="store_true", help="only check that HARNESSES.md is up to date"
    )
    args = ap.parse_args(argv)
    data = load(COMMITTED)
    if args.source:
        fresh = load(args.source)
        if not fresh["cases"]:
            print(f"{args.source}: no cases recorded", file=sys.stderr)
            return 1
        data["cases"].update(fresh["cases"])
        COMMITTED.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    text = render(data)
    if args.check:
        ok = TABLE.exists() and TABLE.read_text() == text
        print(
            f"{TABLE}: {'up to date' if ok else 'out of date: run python tests/harness/render_table.py'}",
            file=sys.stderr,
        )
        return 0 if ok else 1
    TABLE.write_text(text)
    print(f"wrote {TABLE} ({len(data['cases'])} rows)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
