"""The EIP-55 checksum is eth_utils' (a faster copy of the same rule), on any thread."""

from __future__ import annotations

import random
import threading

from eth_hash.auto import keccak as keccak_256
from eth_utils import to_checksum_address

from services.core.checksums import checksum, eip55, keccak


def test_checksum_agrees_with_eth_utils_whatever_the_case_given() -> None:
    rng = random.Random(55)
    for _ in range(2000):
        lower = "0x" + rng.randbytes(20).hex()
        expected = to_checksum_address(lower)
        assert checksum(lower) == expected
        assert eip55(lower) == expected
        assert checksum("0x" + lower[2:].upper()) == expected
        assert checksum(expected) == expected


def test_the_keccak_is_keccak256_on_every_thread() -> None:
    """The checksum's keccak gives keccak256's digest for any length (the known digest
    of b"", not SHA3-256's), whichever thread asks."""
    assert keccak(b"").hex() == ("c5d2460186f7233c927e7db2dcc703c0e500b653ca82273b7bfad8045d85a470")
    rng = random.Random(7)
    inputs = [rng.randbytes(n) for n in (0, 1, 20, 40, 135, 136, 137, 300) for _ in range(20)]
    expected = [keccak_256(data) for data in inputs]
    assert [keccak(data) for data in inputs] == expected
    answers: list[list[bytes]] = []
    threads = [
        threading.Thread(target=lambda: answers.append([keccak(d) for d in inputs]))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == [expected] * 4
