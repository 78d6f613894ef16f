"""Reference solution of fix-sum-off-by-one (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

open("mathutil.py", "w").write('''def sum_to(n):
    return n * (n + 1) // 2 if n > 0 else 0


def mean(xs):
    if not xs:
        raise ValueError("mean of an empty list")
    return sum(xs) / len(xs)
''')
