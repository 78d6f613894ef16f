from fizzbuzz import fizzbuzz

want = [str(i) if i % 3 and i % 5 else "Fizz" * (i % 3 == 0) + "Buzz" * (i % 5 == 0) for i in range(1, 101)]
assert fizzbuzz(100) == want
assert fizzbuzz(0) == []
print("claw-hidden-tests-passed-5e1f")
