import json
import sys


def median(xs):
    return xs[len(xs) // 2]


def summary(xs):
    return {"n": len(xs), "mean": round(sum(xs) / len(xs), 3), "median": median(xs), "max": max(xs)}


if __name__ == "__main__":
    xs = [float(x) for x in open(sys.argv[1]).read().split()]
    with open(sys.argv[2], "w") as fh:
        json.dump(summary(xs), fh)
