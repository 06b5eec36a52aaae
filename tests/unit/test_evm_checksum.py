"""The reader's EIP-55 checksum is eth_utils' (it is a faster copy of the same rule)."""

from __future__ import annotations

import random

from eth_utils import to_checksum_address

from services.core.evm import checksum


def test_checksum_agrees_with_eth_utils_whatever_the_case_given() -> None:
    rng = random.Random(55)
    for _ in range(2000):
        lower = "0x" + rng.randbytes(20).hex()
        expected = to_checksum_address(lower)
        assert checksum(lower) == expected
        assert checksum("0x" + lower[2:].upper()) == expected
        assert checksum(expected) == expected
