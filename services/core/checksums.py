"""EIP-55 checksummed addresses, without web3.

The API processes derive deposit addresses and must not import web3 (it raises
Python's recursion limit, see docs/RELIABILITY.md); the chain reader checksums the
deposits of busy blocks. Both use these. keccak256 is eth_hash's (pycryptodome behind
its public API): ~10 us a call where pycryptodome's private C entry points took ~3 us,
and checksums are cached, so the difference does not show end to end
(docs/DECISIONS.md).
"""

from __future__ import annotations

from functools import lru_cache

from eth_hash.auto import keccak

#: A hex digit of the digest that upper-cases the address's character at its place.
_UPPER = frozenset("89abcdef")


def eip55(lower: str) -> str:
    """The EIP-55 form of an address given as lowercase 0x-hex (not checked, not cached)."""
    # eth_utils' to_checksum_address validates and re-encodes (~3x the cost); this is
    # the EIP-55 rule itself: a letter is upper case where the keccak of the hex text
    # has a nibble >= 8.
    body = lower[2:]
    digest = keccak(body.encode()).hex()  # 64 digits: the first 40 face the address's
    return "0x" + "".join(
        [c.upper() if h in _UPPER else c for c, h in zip(body, digest, strict=False)]
    )


#: Sender and token addresses repeat from block to block.
_cached_eip55 = lru_cache(maxsize=1 << 16)(eip55)


def checksum(address: str) -> str:
    """The EIP-55 form of a 0x-hex address in any case (cached)."""
    return _cached_eip55(address.lower())
