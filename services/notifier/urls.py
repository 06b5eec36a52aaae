"""Which webhook URLs an endpoint may have: the policy checked at creation and update.

This check looks at the URL as written. Host names can still resolve to private
addresses (DNS rebinding, split horizon), so the sender checks the resolved IP again
at send time; this policy catches the obvious cases early, with a clear message.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import SplitResult, urlsplit

#: Longest URL accepted (the column holds 2048 characters).
MAX_URL_LENGTH = 2048
#: Host names that always mean "this machine" or "the cloud's metadata service".
_BLOCKED_HOSTS = frozenset(
    {
        "localhost",
        "localhost.localdomain",
        "ip6-localhost",
        "ip6-loopback",
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "instance-data",
        "instance-data.ec2.internal",
    }
)
#: Suffixes reserved for private or local names (RFC 6761, RFC 6762, common cloud zones).
_BLOCKED_SUFFIXES = (".localhost", ".local", ".internal", ".intranet", ".lan", ".home.arpa")
_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
#: A last label of digits (or 0x...) is an IPv4 address in some notation, never a TLD.
_NUMERIC_LABEL = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$")


class UrlRejected(ValueError):
    """The URL breaks the policy; the message says how, for the person who sent it."""


def check_url(url: object, *, allow_private: bool) -> str:
    """Return `url` if an endpoint may use it, else raise UrlRejected.

    https only; no credentials, no fragment; a public host. `allow_private` (dev)
    also admits http and loopback, private and single-label hosts.
    """
    if not isinstance(url, str) or not url:
        raise UrlRejected("must be a URL string")
    if len(url) > MAX_URL_LENGTH:
        raise UrlRejected(f"must be at most {MAX_URL_LENGTH} characters")
    if any(ch.isspace() or not ch.isprintable() for ch in url):
        raise UrlRejected("must not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError when out of range or not a number
    except ValueError:
        raise UrlRejected("is not a valid URL") from None
    allowed = ("https", "http") if allow_private else ("https",)
    if parts.scheme not in allowed:
        raise UrlRejected(
            "must use https" if not allow_private else "must use https or http (dev only)"
        )
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise UrlRejected(
            "must not carry credentials (user:password@); receivers check the signature instead"
        )
    if parts.fragment or url.endswith("#"):
        raise UrlRejected("must not have a #fragment")
    if port == 0:
        raise UrlRejected("port must be between 1 and 65535")
    _check_host(parts, allow_private=allow_private)
    return url


def _check_host(parts: SplitResult, *, allow_private: bool) -> None:
    host = parts.hostname  # lower-cased, brackets of IPv6 literals removed
    if not host:
        raise UrlRejected("must name a host")
    literal = _ip_literal(host, bracketed="[" in parts.netloc)
    if literal is not None:
        if not allow_private and not _is_public(literal):
            raise UrlRejected(
                "points to a private, loopback, link-local or reserved address; "
                "webhooks go to public hosts"
            )
        return
    name = host.rstrip(".")
    try:
        ascii_name = name.encode("idna").decode("ascii")
    except UnicodeError:
        raise UrlRejected("has a host name that is not valid") from None
    labels = ascii_name.split(".")
    if len(ascii_name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise UrlRejected("has a host name that is not valid")
    if allow_private:
        return
    if ascii_name in _BLOCKED_HOSTS or ascii_name.endswith(_BLOCKED_SUFFIXES):
        raise UrlRejected("points to a local or internal host name; webhooks go to public hosts")
    if len(labels) < 2:
        raise UrlRejected("must use a fully qualified host name (e.g. hooks.example.com)")


def _ip_literal(
    host: str, *, bracketed: bool
) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address when `host` is an IP literal; odd IPv4 notations are refused outright."""
    if bracketed:
        try:
            return ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            raise UrlRejected("has an IPv6 address that is not valid") from None
    try:
        return ipaddress.IPv4Address(host)
    except ValueError:
        pass
    # `2130706433`, `0x7f.1`, `127.1`, `0177.0.0.1` all reach 127.0.0.1 through
    # inet_aton; only the dotted-decimal form is accepted, so nothing hides a target.
    if _NUMERIC_LABEL.match(host.rstrip(".").rsplit(".", 1)[-1]):
        raise UrlRejected("has an IP address in a non-standard notation; use a.b.c.d")
    return None


def _is_public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Globally routable unicast (IPv4 inside IPv6 forms judged by the IPv4 address)."""
    if isinstance(address, ipaddress.IPv6Address):
        mapped = address.ipv4_mapped or address.sixtofour
        if mapped is not None:
            return _is_public(mapped)
        if address.teredo is not None:
            return False
    return address.is_global and not (address.is_multicast or address.is_reserved)
