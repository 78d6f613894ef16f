def totals(path):
    out = {}
    lines = open(path).read().splitlines()
    for line in lines[1:]:
        customer, amount = line.split(',')
        out[customer] = out.get(customer, 0) + float(amount)
    return out
