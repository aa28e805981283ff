"""Read a balance from the chain; a node that cannot be reached fails the call as a
retryable `io_error`, so the worker tries it again (policy.max_attempts)."""


def _(p):
    wei = ChainState("eth", "latest").get_address_balance(p["address"])
    return {"address": p["address"], "wei": wei}
