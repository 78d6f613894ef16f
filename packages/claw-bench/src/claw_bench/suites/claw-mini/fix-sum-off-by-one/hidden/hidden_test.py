from mathutil import mean, sum_to

assert sum_to(1) == 1 and sum_to(10) == 55 and sum_to(0) == 0 and sum_to(-3) == 0
assert mean([5]) == 5 and mean([1, 2, 3, 4]) == 2.5
try:
    mean([])
except ValueError:
    pass
else:
    raise AssertionError("mean([]) must raise ValueError")
print("claw-hidden-tests-passed-5e1f")
