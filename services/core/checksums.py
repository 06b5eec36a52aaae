"""EIP-55 checksummed addresses and a fast keccak256, without web3.

The API processes derive deposit addresses and must not import web3 (it raises
Python's recursion limit, see docs/RELIABILITY.md); the chain reader checksums the
deposits of busy blocks. Both use these.
"""

from __future__ import annotations

import threading
from functools import lru_cache
from typing import Any

from eth_hash.auto import keccak as keccak_256


class _Keccak:
    """keccak256 on pycryptodome's C functions with one reusable state per thread:
    ~1.7 us a call where its Python wrapper (eth_hash's backend) costs ~7 us, which made
    checksumming the senders and recipients of a busy block's deposits a few percent
    of the watcher's CPU. None when that library's internals are not as expected; then
    `keccak_256` serves (the same digest)."""

    def __init__(self) -> None:
        from Crypto.Hash.keccak import _raw_keccak_lib
        from Crypto.Util._raw_api import SmartPointer, VoidPointer, ffi

        self._lib = _raw_keccak_lib
        self._void_pointer = VoidPointer
        self._smart_pointer = SmartPointer
        self._ffi = ffi
        self._local = threading.local()
        if self(b"") != keccak_256(b""):
            raise RuntimeError("pycryptodome's keccak does not answer as expected")

    def _state(self) -> Any:
        state = self._void_pointer()
        # keccak256: capacity 512 bits, 24 rounds.
        if self._lib.keccak_init(state.address_of(), 64, 24):
            raise RuntimeError("keccak_init failed")
        out = self._ffi.new("uint8_t[32]")
        # One state per thread, freed with the thread's locals (as pycryptodome frees its
        # own: keccak_destroy when the pointer's holder goes).
        owner = self._smart_pointer(state.get(), self._lib.keccak_destroy)
        self._local.state = made = (owner.get(), out, self._ffi.buffer(out), owner)
        return made

    def __call__(self, data: bytes) -> bytes:
        made = getattr(self._local, "state", None)
        state, out, buffer, _ = made if made is not None else self._state()
        lib = self._lib
        lib.keccak_reset(state)
        lib.keccak_absorb(state, data, len(data))
        lib.keccak_digest(state, out, 32, 1)  # padding 0x01: Keccak, not SHA-3
        return buffer[:]


def _fast_keccak() -> Any:
    try:
        return _Keccak()
    except Exception:  # another pycryptodome: its public wrapper is as correct
        return keccak_256


#: keccak256(data) -> 32 bytes, the fastest this machine has.
keccak = _fast_keccak()
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
