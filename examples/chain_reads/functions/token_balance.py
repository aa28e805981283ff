"""An ERC-20 balance at a block: `balanceOf(holder)` through `eth_call`, in the token's units."""

BALANCE_OF = "0x70a08231"  # the selector of balanceOf(address)


def _(p):
    holder_word = p["holder"].lower().removeprefix("0x").rjust(64, "0")
    state = ChainState("eth", p["block"])
    answer = state.call(p["token"], BALANCE_OF + holder_word)
    return int(answer, 16) if answer not in ("0x", "") else 0
