import os
import tempfile
from pathlib import Path

from report import totals

d = tempfile.mkdtemp()
p = os.path.join(d, "x.csv")
Path(p).write_text('customer,amount\n"Quote ""Q"" Inc",2\nB,3\n"Quote ""Q"" Inc",0.25\n"a,b,c",1\n')
assert totals(p) == {'Quote "Q" Inc': 2.25, "B": 3.0, "a,b,c": 1.0}, totals(p)
Path(p).write_text("customer,amount\n")
assert totals(p) == {}
print("claw-hidden-tests-passed-5e1f")
