"""A token's USD price: from the `prices` table, else from a (pretend) slow price API.

`Table`, `function` and `ChainState` are predefined in every BlockX function:
no imports needed. `time.sleep` inside a call suspends only this call.
"""

import time

# What our pretend price API answers (a real one would be an HTTP call).
QUOTES = {"ETH": 3150.25, "BTC": 64210.0, "SOL": 148.6, "USDC": 1.0}


def _(symbol):
    prices = Table("prices")
    row = prices.get_row(symbol)
    if row is None:
        time.sleep(0.2)  # the slow upstream API; other calls run meanwhile
        row = {"key": symbol, "usd": QUOTES[symbol]}
        prices.upsert_row(row)
    return row["usd"]
