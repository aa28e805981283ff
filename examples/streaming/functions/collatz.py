"""Steps of the Collatz sequence from n down to 1, and the highest value on the way."""


def _(p):
    n = p["n"]
    steps, peak = 0, n
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        peak = max(peak, n)
        steps += 1
    return {"n": p["n"], "steps": steps, "peak": peak}
