from fizzbuzz import fizzbuzz

assert fizzbuzz(5) == ['1', '2', 'Fizz', '4', 'Buzz']
print('ok')
