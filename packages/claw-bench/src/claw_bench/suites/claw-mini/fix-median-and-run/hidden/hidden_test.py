from stats import median
assert median([3, 1, 2]) == 2
assert median([4, 1, 3, 2]) == 2.5
assert median([5]) == 5
assert median([10, 2, 8, 4]) == 6
print("claw-hidden-tests-passed-5e1f")
