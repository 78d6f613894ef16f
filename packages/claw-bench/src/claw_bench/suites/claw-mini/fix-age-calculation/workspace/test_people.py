from people import age_on

assert age_on('2000-06-15', '2024-06-14') == 23
assert age_on('2000-06-15', '2024-06-15') == 24
print('ok')
