"""Reference solution of fix-word-count (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

open("wordcount.py", "w").write('''import re


def count_words(text):
    counts = {}
    for word in re.findall(r"[a-z0-9']+", text.lower()):
        word = word.strip("'")
        if word:
            counts[word] = counts.get(word, 0) + 1
    return counts
''')
