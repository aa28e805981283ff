"""One account at one block: balance, nonce, whether it is a contract, and its USDC.

`ChainState(chain, block)` reads through the worker: concurrent reads are
batched into JSON-RPC batch requests and equal reads are made once per task.
"""

USDC = "0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48"


def _(p):
    state = ChainState("eth", p["block"])
    address = p["address"]
    wei = state.get_address_balance(address)  # an int, exact (wei amounts exceed 64 bits)
    usdc = function.call("token_balance", {"token": USDC, "holder": address, "block": p["block"]})
    return {
        "address": address,
        "block": p["block"],
        "balance_wei": wei,
        "balance_eth": wei / 10**18,
        "nonce": state.get_address_nonce(address),
        "is_contract": state.get_address_code(address) != "0x",
        "usdc": usdc,
    }
