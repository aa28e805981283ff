"""Parse a money amount; bad input raises, which fails the call as `user_error` (no retry)."""

from decimal import Decimal


def check_positive(amount):
    if amount <= 0:
        raise ValueError(f"amount must be positive, got {amount}")
    return amount


def _(p):
    amount = check_positive(Decimal(p["amount"]))
    return {"currency": p["currency"], "cents": int(amount * 100)}
