from mathutil import mean, sum_to

assert sum_to(3) == 6
assert mean([2, 4]) == 3
print('ok')
