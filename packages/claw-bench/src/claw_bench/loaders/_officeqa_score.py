"""OfficeQA's answer scoring, reimplemented: ``score_answer(truth, response, tolerance)`` in {0, 1}.

It gives the value that ``reward.py`` of github.com/databricks/officeqa gives (checked against
commit 7b9a3c1 on every question of the published CSV times a set of perturbed answers, see
tests/test_officeqa.py). The rules, in the order they apply:

1. The answer is the text inside the last ``<FINAL_ANSWER>...</FINAL_ANSWER>`` of the response
   (any case, any span of lines), else the whole response.
2. Direct-answer guard: one non-empty line, at most 250 characters; for a truth with numbers the
   answer holds as many numbers (year-like ones dropped when the truth is no year and has no
   words) unless it splits into the truth's bracketed list, and no ``<...>`` markup; for a truth
   without numbers the answer holds none and equals it after lower-casing, unquoting and
   dropping parenthesised text.
3. Fuzzy match: numbers are read after accounting parentheses (``(12)`` is -12, unless a bare
   year) and currency signs are undone and thousands commas dropped; each number's unit
   (trillion / billion or ``b`` / million or ``m`` / thousand or ``k``) comes from the 20
   characters around it, and two numbers compare when either has no unit or both the same; the
   relative difference must be at most ``tolerance`` (0 = exact). A bracketed list in the truth
   is compared in order; other multi-number truths need every number somewhere in the answer;
   a truth with words besides numbers and unit words ("March 1977") also needs those words.
   Without numbers on both sides the cleaned truth must appear in the cleaned answer. An answer
   saying "unable to determine" scores 0, and so does any parse failure.
"""

from __future__ import annotations

import re

Number = tuple[float, str]  # (value, lower-cased context of 20 characters either side)

_MONEY = "$£€¥₹¢₩₽"
_PAREN_NUMBER = re.compile(
    rf"\(\s*([{_MONEY}])?\s*(\d{{1,3}}(?:,\d{{3}})*(?:\.\d+)?|\d+(?:\.\d+)?)\s*\)"
)
_MONEY_SIGN = re.compile(rf"[{_MONEY}]")
_GROUPED = re.compile(r"(?<![\d.])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\d)")
_NUMBER = re.compile(r"-?\d+\.?\d*%?")
_LIST_ITEM = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?%?")
_BRACKETS = re.compile(r"\[([^\[\]]+)\]")
_TAGGED = re.compile(r"<FINAL_ANSWER>\s*(.*?)\s*</FINAL_ANSWER>", re.DOTALL | re.IGNORECASE)
_MARKUP = re.compile(r"<[^>]*>")
_PARENS = re.compile(r"\([^)]*\)")
_UNIT_WORDS = re.compile(
    r"\b(?:trillions?|billions?|millions?|thousands?|hundreds?|percent|percentage)\b"
)
_UNITS = (
    ("trillion", re.compile(r"\btrillions?\b")),
    ("billion", re.compile(r"\bbillions?\b|\bb\b")),
    ("million", re.compile(r"\bmillions?\b|\bm\b")),
    ("thousand", re.compile(r"\bthousands?\b|\bk\b")),
)
MAX_DIRECT_CHARS = 250


def final_answer(response: str) -> str:
    """The answer inside the response's last ``<FINAL_ANSWER>`` tag pair, else the response."""
    if not response:
        return ""
    tagged = list(_TAGGED.finditer(response))
    return tagged[-1].group(1).strip() if tagged else response


def _squash(text: str) -> str:
    """Unicode minus to ``-``, runs of whitespace to one space, trimmed; empty text is an error."""
    if not text:
        raise ValueError("empty text")
    return re.sub(r"\s+", " ", text.replace("\u2212", "-")).strip()


def is_year(value: float) -> bool:
    """A whole number from 1900 to 2100."""
    return 1900 <= value <= 2100 and value == int(value)


def _undo_money(text: str) -> str:
    """``(12)`` / ``($12)`` as -12 (a bare year in parentheses stays), currency signs dropped."""

    def negate(m: re.Match[str]) -> str:
        if m.group(1) is None and is_year(float(m.group(2).replace(",", ""))):
            return m.group(0)
        return "-" + m.group(2)

    return _MONEY_SIGN.sub("", _PAREN_NUMBER.sub(negate, text))


def numbers(text: str) -> list[Number]:
    """Every number of ``text`` with its context (see the module docstring)."""
    flat = _GROUPED.sub(lambda m: m.group().replace(",", ""), _undo_money(_squash(text)))
    found = []
    for m in _NUMBER.finditer(flat):
        around = flat[max(0, m.start() - 20) : min(len(flat), m.end() + 20)].lower()
        found.append((float(m.group().rstrip("%")), around))
    return found


def unit_of(context: str) -> str | None:
    """The scale word of a number's context, largest first; None without one."""
    low = context.lower()
    return next((name for name, pat in _UNITS if pat.search(low)), None)


def _same_unit(a: str | None, b: str | None) -> bool:
    return a is None or b is None or a == b


def _close(truth: float, got: float, tolerance: float) -> bool:
    """Equal when the truth is 0, else within ``tolerance`` relative difference."""
    if truth == 0:
        return got == 0
    return abs(truth - got) / abs(truth) <= tolerance


def words_of(text: str) -> str:
    """What is left of ``text`` without numbers, commas, unit words and punctuation."""
    if not text:
        return ""
    rest = re.sub(r"[,]", "", _NUMBER.sub("", _squash(text).lower()))
    rest = re.sub(r"\b%\b", "", _UNIT_WORDS.sub("", rest))
    return re.sub(r"\s+", " ", re.sub(r"[^\w\s]", " ", rest)).strip()


def _has_words(text: str) -> bool:
    return len(words_of(text)) >= 2


def _words_agree(truth: str, answer: str) -> bool:
    """True when the truth has no words, or its words and the answer's contain one another."""
    if not truth or not answer:
        return False
    if not _has_words(truth):
        return True
    if not _has_words(answer):
        return False
    t, a = words_of(truth), words_of(answer)
    return t in a or a in t


def _drop_years(truth_nums: list[Number], got: list[Number], truth: str) -> list[Number]:
    """The answer's numbers without year-like ones, unless the truth is (or names) a year."""
    if not truth_nums:
        return got
    if len(truth_nums) == 1:
        keep = is_year(truth_nums[0][0]) or _has_words(truth)
    else:
        keep = any(is_year(v) for v, _ in truth_nums)
    return got if keep else [(v, c) for v, c in got if not is_year(v)]


def _list_body(text: str) -> str | None:
    """The inside of the text's only ``[...]`` when nothing outside it has a digit."""
    flat = _squash(text)
    found = list(_BRACKETS.finditer(flat))
    if len(found) != 1:
        return None
    outside = flat[: found[0].start()] + flat[found[0].end() :]
    return None if re.search(r"\d", outside.strip()) else found[0].group(1)


def _item_value(piece: str) -> float | None:
    """One list item as a number (thousands commas allowed, no comma next to a space)."""
    piece = piece.strip()
    if not piece or ("," in piece and re.search(r"\s,|,\s", piece)):
        return None
    piece = _undo_money(_squash(piece))
    if not _LIST_ITEM.fullmatch(piece):
        return None
    return float(piece.rstrip("%").replace(",", ""))


def list_readings(text: str, size: int) -> list[list[float]]:
    """Every way to read ``text`` (or its bracketed body) as ``size`` comma-separated numbers,
    commas inside an item read as thousands separators: ``8,152,260`` gives [8, 152260] and
    [8152, 260] for size 2. Empty for size < 2."""
    if size < 2:
        return []
    body = _list_body(text) or _squash(text)
    cuts = [-1] + [i for i, ch in enumerate(body) if ch == ","] + [len(body)]
    n_chunks = len(cuts) - 1
    if n_chunks < size:
        return []
    memo: dict[tuple[int, int], list[list[float]]] = {}

    def read(first: int, left: int) -> list[list[float]]:
        if (first, left) not in memo:
            if left == 0:
                memo[first, left] = [[]] if first == n_chunks else []
            else:
                out = []
                for last in range(first, n_chunks - left + 1):
                    value = _item_value(body[cuts[first] + 1 : cuts[last + 1]])
                    if value is not None:
                        out += [[value, *rest] for rest in read(last + 1, left - 1)]
                memo[first, left] = out
        return memo[first, left]

    unique: dict[tuple[float, ...], list[float]] = {}
    for r in read(0, size):
        unique.setdefault(tuple(r), r)
    return list(unique.values())


def _truth_list(truth: str, truth_nums: list[Number]) -> list[Number] | None:
    """The truth's numbers when it is one bracketed list of at least two that reads as them."""
    body = _list_body(truth)
    if body is None or len(truth_nums) < 2:
        return None
    values = [v for v, _ in truth_nums]
    return truth_nums if values in list_readings(body, len(values)) else None


def _in_order(truth_nums: list[Number], got: list[Number], tolerance: float) -> bool:
    if len(truth_nums) != len(got):
        return False
    return all(
        _same_unit(unit_of(tc), unit_of(gc)) and _close(tv, gv, tolerance)
        for (tv, tc), (gv, gc) in zip(truth_nums, got, strict=True)
    )


def _list_match(
    truth: str, answer: str, truth_nums: list[Number], got: list[Number], tolerance: float
) -> bool | None:
    """None unless the truth is a bracketed list; then whether the answer gives it in order."""
    wanted = _truth_list(truth, truth_nums)
    if wanted is None:
        return None
    if any(
        _in_order(wanted, [(v, "") for v in r], tolerance)
        for r in list_readings(answer, len(wanted))
    ):
        return True
    return _in_order(wanted, _drop_years(wanted, got, truth), tolerance)


def _all_found(
    truth: str, answer: str, truth_nums: list[Number], got: list[Number], tol: float
) -> bool:
    """Every number of a multi-number truth somewhere among the answer's (years dropped unless
    the truth has one), words agreeing."""
    if not any(is_year(v) for v, _ in truth_nums):
        got = [(v, c) for v, c in got if not is_year(v)]
    for tv, tc in truth_nums:
        if not any(
            _same_unit(unit_of(tc), unit_of(gc))
            and _close(tv, gv, tol)
            and _words_agree(truth, answer)
            for gv, gc in got
        ):
            return False
    return True


def _one_found(truth: str, answer: str, truth_num: Number, got: list[Number], tol: float) -> bool:
    """A single-number truth among the answer's numbers (years dropped unless the truth is a year
    or has words), words agreeing."""
    tv, tc = truth_num
    skip_years = not (is_year(tv) or _has_words(truth))
    for gv, gc in got:
        if (skip_years and is_year(gv)) or not _same_unit(unit_of(tc), unit_of(gc)):
            continue
        if _close(tv, gv, tol) and _words_agree(truth, answer):
            return True
    return False


def _text_key(text: str) -> str:
    cleaned = text.strip().lower().strip('"').strip("'")
    return re.sub(r"\s+", " ", _PARENS.sub("", cleaned)).strip()


def fuzzy_match(truth: str, answer: str, tolerance: float = 0.0) -> bool:
    """Rule 3 of the module docstring; ValueError on an empty truth or a tolerance outside [0, 1]."""
    if not truth:
        raise ValueError("the true answer is empty")
    if not answer:
        return False
    if not 0 <= tolerance <= 1:
        raise ValueError(f"tolerance must be in [0, 1], got {tolerance}")
    if "unable to determine" in answer.lower():
        return False
    truth_nums, got = numbers(truth), numbers(answer)
    if truth_nums and got:
        listed = _list_match(truth, answer, truth_nums, got, tolerance)
        if listed is not None:
            return listed
        if len(truth_nums) > 1:
            return _all_found(truth, answer, truth_nums, got, tolerance)
        return _one_found(truth, answer, truth_nums[0], got, tolerance)
    return _text_key(truth) in _text_key(answer)


def _direct_key(text: str) -> str:
    cleaned = text.strip().lower().strip('"').strip("'")
    return re.sub(r"\s+", " ", _PARENS.sub("", cleaned).strip())


def is_direct(truth: str, answer: str) -> bool:
    """Rule 2 of the module docstring."""
    answer = answer.strip()
    if not answer or len([ln for ln in answer.splitlines() if ln.strip()]) > 1:
        return False
    if len(answer) > MAX_DIRECT_CHARS:
        return False
    truth_nums, got = numbers(truth), numbers(answer)
    if truth_nums:
        if len(_drop_years(truth_nums, got, truth)) != len(truth_nums):
            wanted = _truth_list(truth, truth_nums)
            if wanted is None or not list_readings(answer, len(wanted)):
                return False
        return not _MARKUP.search(answer)
    return not got and _direct_key(truth) == _direct_key(answer)


def score_answer(truth: str, response: str, tolerance: float = 0.0) -> float:
    """1.0 when the response's final answer matches the truth (OfficeQA's rules), else 0.0."""
    answer = final_answer(response)
    try:
        return 1.0 if is_direct(truth, answer) and fuzzy_match(truth, answer, tolerance) else 0.0
    except (ValueError, ArithmeticError, RecursionError):
        return 0.0
