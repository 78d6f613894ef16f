from wordcount import count_words

assert count_words('a b  a') == {'a': 2, 'b': 1}
assert count_words('Hello, hello!') == {'hello': 2}
print('ok')
