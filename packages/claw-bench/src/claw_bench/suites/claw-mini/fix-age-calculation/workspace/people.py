def age_on(birth, day):
    return int(day[:4]) - int(birth[:4])
