"""Unit tests of the quickstart's functions, run in process by ``blockx.testing``.

    pytest examples/quickstart/tests

The ``blockx_function`` fixture comes from BlockX's pytest plugin (installed with
BlockX). Each test loads a function file with in-memory tables; sub-calls run
the other loaded function right here, and ``time.sleep`` advances a virtual
clock instead of waiting.
"""

from __future__ import annotations

import pytest

TOKEN_PRICE = "../functions/token_price.py"
WALLET_VALUE = "../functions/wallet_value.py"


def test_a_known_price_is_read_from_the_table(blockx_function):
    price = blockx_function(TOKEN_PRICE, tables={"prices": [{"key": "ETH", "usd": 3000.0}]})

    assert price("ETH") == 3000.0
    assert price.clock.sleeps == []  # no call to the slow API


def test_an_unknown_price_is_asked_for_and_written_back(blockx_function):
    price = blockx_function(TOKEN_PRICE)

    assert price("SOL") == 148.6
    assert price.clock.sleeps == [0.2]  # the pretend API's latency, not waited for
    assert price.tables.get("prices", "SOL") == {"key": "SOL", "usd": 148.6}


def test_an_unknown_symbol_fails(blockx_function):
    price = blockx_function(TOKEN_PRICE)

    with pytest.raises(KeyError):
        price("DOGE")


def test_a_wallet_is_valued_with_sub_calls_and_recorded(blockx_function):
    wallet = blockx_function(
        WALLET_VALUE,
        functions={"token_price": TOKEN_PRICE},
        tables={"prices": [{"key": "ETH", "usd": 3000.0}, {"key": "USDC", "usd": 1.0}]},
    )

    out = wallet({"wallet": "alice", "holdings": {"ETH": 2.5, "USDC": 1200}})

    assert out == {
        "wallet": "alice",
        "usd": 8700.0,
        "tokens": [
            {"token": "ETH", "amount": 2.5, "usd": 7500.0},
            {"token": "USDC", "amount": 1200, "usd": 1200.0},
        ],
    }
    assert wallet.tables.rows("wallet_values") == [{"key": "alice", "usd": 8700.0}]
    assert [name for name, _args, _cached in wallet.subcalls] == ["token_price", "token_price"]


def test_equal_sub_calls_of_one_task_run_once(blockx_function):
    wallet = blockx_function(WALLET_VALUE, functions={"token_price": TOKEN_PRICE})

    wallet({"wallet": "bob", "holdings": {"BTC": 0.1}})
    wallet({"wallet": "dave", "holdings": {"BTC": 0.02}})

    assert wallet.subcalls == [("token_price", "BTC", False), ("token_price", "BTC", True)]
    assert wallet.clock.sleeps == [0.2]  # one lookup of the API for both wallets
    assert wallet.tables.get("wallet_values", "dave") == {"key": "dave", "usd": 1284.2}


def test_an_empty_wallet_is_worth_nothing(blockx_function):
    wallet = blockx_function(WALLET_VALUE, functions={"token_price": TOKEN_PRICE})

    assert wallet({"wallet": "erin", "holdings": {}}) == {
        "wallet": "erin",
        "usd": 0.0,
        "tokens": [],
    }
