"""One output row per decimal digit of n: a function returning a list gives many rows."""


def _(p):
    return [{"n": p["n"], "position": i, "digit": int(d)} for i, d in enumerate(str(p["n"]))]
