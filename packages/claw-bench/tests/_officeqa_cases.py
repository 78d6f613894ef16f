"""Perturbed answers for OfficeQA scoring parity: each true answer rewritten the ways an agent
gets it slightly (or badly) wrong, scored at several tolerances.

Used by test_officeqa.py (against the frozen table in data/officeqa/expected_scores.jsonl) and
by bench/officeqa_parity.py (against the real reward.py on the published CSV).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

TOLERANCES = (0.0, 0.01, 0.05)
_NUM = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\d,]\d)")


def _each_number(answer: str, f: Callable[[str], str]) -> str:
    return _NUM.sub(lambda m: f(m.group()), answer)


def _first_number(answer: str, f: Callable[[str], str]) -> str:
    return _NUM.sub(lambda m: f(m.group()), answer, count=1)


def _value(s: str) -> float:
    return float(s.replace(",", ""))


def _decimals(s: str) -> int:
    return len(s.split(".")[1]) if "." in s else 0


def _scaled(k: float) -> Callable[[str], str]:
    def f(s: str) -> str:
        return f"{_value(s) * k:.{max(_decimals(s), 2)}f}"

    return f


def _rounded(n: int) -> Callable[[str], str]:
    def f(s: str) -> str:
        return f"{round(_value(s), n):.{n}f}"

    return f


def _grouped(s: str) -> str:
    v = _value(s)
    return f"{v:,.{_decimals(s)}f}"


PERTURBATIONS: dict[str, Callable[[str], str]] = {
    "exact": lambda a: a,
    "tagged": lambda a: f"I read the tables.\n<FINAL_ANSWER>{a}</FINAL_ANSWER>",
    "tagged_last": lambda a: (
        f"<final_answer>0</final_answer> then\n<FINAL_ANSWER> {a} </FINAL_ANSWER>"
    ),
    "upper": lambda a: a.upper(),
    "quoted": lambda a: f'"{a}"',
    "sentence": lambda a: f"The answer is {a}.",
    "no_commas": lambda a: _each_number(a, lambda s: s.replace(",", "")),
    "add_commas": lambda a: _each_number(a, _grouped),
    "million": lambda a: f"{a} million",
    "billions": lambda a: f"{a} billions",
    "k_suffix": lambda a: _each_number(a, lambda s: s + "k"),
    "drop_units": lambda a: re.sub(r"\s*\b(?:million|billion|thousand)s?\b", "", a, flags=re.I),
    "percent_add": lambda a: _each_number(a, lambda s: s + "%"),
    "percent_drop": lambda a: a.replace("%", ""),
    "percent_word": lambda a: a.replace("%", " percent"),
    "negate": lambda a: _first_number(a, lambda s: s[1:] if s.startswith("-") else "-" + s),
    "accounting": lambda a: _first_number(a, lambda s: f"({s.lstrip('-')})"),
    "dollar_accounting": lambda a: _first_number(a, lambda s: f"(${s.lstrip('-')})"),
    "unicode_minus": lambda a: a.replace("-", "\u2212"),
    "dollar": lambda a: _first_number(a, lambda s: "$" + s),
    "round_0": lambda a: _each_number(a, _rounded(0)),
    "round_1": lambda a: _each_number(a, _rounded(1)),
    "round_2": lambda a: _each_number(a, _rounded(2)),
    "plus_0.5pct": lambda a: _each_number(a, _scaled(1.005)),
    "plus_3pct": lambda a: _each_number(a, _scaled(1.03)),
    "minus_6pct": lambda a: _each_number(a, _scaled(0.94)),
    "times_1000": lambda a: _each_number(a, _scaled(1000)),
    "with_year": lambda a: f"{a} (in 1999)",
    "year_prefix": lambda a: f"In 1999: {a}",
    "parenthetical": lambda a: f"{a} (approx.)",
    "two_lines": lambda a: f"{a}\nSource: the bulletin",
    "too_long": lambda a: f"{a} " + "because " * 40,
    "markup": lambda a: f"<b>{a}</b>",
    "unable": lambda a: f"Unable to determine; maybe {a}",
    "empty": lambda a: "",
    "bracketed": lambda a: a if a.startswith("[") else f"[{a}]",
    "unbracketed": lambda a: a.strip("[]"),
    "list_no_space": lambda a: a.replace(", ", ","),
    "reversed": lambda a: ", ".join(reversed(a.strip("[]").split(", "))),
    "extra_number": lambda a: f"{a} and 42",
}


def cases(answer: str) -> Iterator[tuple[str, str, float]]:
    """(perturbation, predicted, tolerance) for one true answer; ``exact`` also at tolerance 1.5,
    outside [0, 1] (scored 0)."""
    for name, f in PERTURBATIONS.items():
        predicted = f(answer)
        for tol in TOLERANCES:
            yield name, predicted, tol
    yield "exact", answer, 1.5
