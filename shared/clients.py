"""What a client is counted as, by every per-client limit (rate limits, sign-in failures)."""

from __future__ import annotations

import ipaddress


def client_key(address: str) -> str:
    """What a client is counted as: its IPv4 address, or its IPv6 /64.

    One IPv6 host usually holds a whole /64 (2^64 addresses): counted per address, it
    could take a fresh budget, or fresh free failures, for ever (issue 23).
    """
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)
