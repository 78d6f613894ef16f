from wordcount import count_words

assert count_words("") == {}
assert count_words("The cat.\nthe DOG, the end") == {"the": 3, "cat": 1, "dog": 1, "end": 1}
assert count_words("don't stop -- don't!") == {"don't": 2, "stop": 1}
assert count_words("  x\t\ty  ") == {"x": 1, "y": 1}
assert count_words("route 66 and 66") == {"route": 1, "66": 2, "and": 1}
print("claw-hidden-tests-passed-5e1f")
