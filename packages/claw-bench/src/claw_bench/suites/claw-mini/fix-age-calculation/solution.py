"""Reference solution of fix-age-calculation (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

open("people.py", "w").write('''def age_on(birth, day):
    by, bm, bd = map(int, birth.split("-"))
    y, m, d = map(int, day.split("-"))
    return y - by - ((m, d) < (bm, bd))
''')
