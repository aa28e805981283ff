"""The USD value of one wallet's holdings, recorded in the `wallet_values` table."""


def _(p):
    lines = []
    for symbol, amount in sorted(p["holdings"].items()):
        usd = function.call("token_price", symbol)  # a sub-call: runs token_price(symbol)
        lines.append({"token": symbol, "amount": amount, "usd": round(amount * usd, 2)})
    total = round(sum((line["usd"] for line in lines), 0.0), 2)
    Table("wallet_values").upsert_row({"key": p["wallet"], "usd": total})
    return {"wallet": p["wallet"], "usd": total, "tokens": lines}
