"""A fixed BIP32 key pair for tests (never used outside tests)."""

from __future__ import annotations

from functools import cache

from bip_utils import Bip32Secp256k1

_SEED = bytes.fromhex("000102030405060708090a0b0c0d0e0f" * 2)


@cache
def test_xprv() -> str:
    return Bip32Secp256k1.FromSeed(_SEED).PrivateKey().ToExtended()


@cache
def test_xpub() -> str:
    return Bip32Secp256k1.FromSeed(_SEED).PublicKey().ToExtended()
