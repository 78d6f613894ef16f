from report import totals

assert totals('data.csv') == {'Smith, John': 12.0, 'Ada': 4.0}
print('ok')
