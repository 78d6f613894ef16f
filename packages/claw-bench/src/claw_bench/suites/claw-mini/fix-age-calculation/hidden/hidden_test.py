from people import age_on

assert age_on("1990-01-01", "2024-12-31") == 34
assert age_on("1990-12-31", "2024-01-01") == 33
assert age_on("2000-02-29", "2023-02-28") == 22
assert age_on("2000-02-29", "2023-03-01") == 23
assert age_on("2000-02-29", "2024-02-29") == 24
assert age_on("2024-05-05", "2024-05-05") == 0
print("claw-hidden-tests-passed-5e1f")
