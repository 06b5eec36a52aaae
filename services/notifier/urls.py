"""Which webhook URLs an endpoint may have: the policy checked at creation and update.

This check looks at the URL as an HTTP client reads it: the host after IDNA (UTS 46)
mapping, so fullwidth digits or ideographic dots cannot hide an address, and IP
literals judged by the sender's own guard (`sender.is_blocked_ip`), so the two never
disagree. Host names can still resolve to private addresses (DNS rebinding, split
horizon), so the sender checks the resolved IP again at send time; this policy
catches the obvious cases early, with a clear message.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import SplitResult, urlsplit

import idna

from services.notifier.sender import IPAddress, is_blocked_ip

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
    if "[" in parts.netloc:
        try:
            literal: IPAddress | None = ipaddress.IPv6Address(host)
        except ValueError:
            raise UrlRejected("has an IPv6 address that is not valid") from None
        _check_address(literal, allow_private=allow_private)
        return
    # Judge the host as an HTTP client will read it: UTS 46 maps fullwidth digits and
    # letters, ideographic full stops and upper case to their plain forms, so
    # fullwidth digits with ideographic dots spelling 127.0.0.1 are 127.0.0.1 here too.
    normal, ascii_name = _normal_host(host)
    literal = _ip_literal(ascii_name)
    if literal is not None:
        _check_address(literal, allow_private=allow_private)
    else:
        _check_name(ascii_name, allow_private=allow_private)
    if normal != host.rstrip("."):
        raise UrlRejected(f"must spell its host plainly: write {normal!r}")


def _normal_host(host: str) -> tuple[str, str]:
    """(the UTS 46 mapped name, its ASCII form), without the root dot."""
    try:
        normal = idna.uts46_remap(host, std3_rules=False, transitional=False).rstrip(".")
        labels = [
            label if label.isascii() else idna.alabel(label).decode("ascii")
            for label in normal.split(".")
        ]
    except (idna.IDNAError, UnicodeError):
        raise UrlRejected("has a host name that is not valid") from None
    return normal, ".".join(labels)


def _check_address(address: IPAddress, *, allow_private: bool) -> None:
    """One policy with the sender's send-time guard: whatever it refuses is refused here."""
    if not allow_private and is_blocked_ip(address):
        raise UrlRejected(
            "points to a private, loopback, link-local or reserved address; "
            "webhooks go to public hosts"
        )


def _check_name(ascii_name: str, *, allow_private: bool) -> None:
    labels = ascii_name.split(".")
    if len(ascii_name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise UrlRejected("has a host name that is not valid")
    if allow_private:
        return
    if ascii_name in _BLOCKED_HOSTS or ascii_name.endswith(_BLOCKED_SUFFIXES):
        raise UrlRejected("points to a local or internal host name; webhooks go to public hosts")
    if len(labels) < 2:
        raise UrlRejected("must use a fully qualified host name (e.g. hooks.example.com)")


def _ip_literal(ascii_name: str) -> ipaddress.IPv4Address | None:
    """The address when the host is an IPv4 literal; odd notations are refused outright."""
    try:
        return ipaddress.IPv4Address(ascii_name)
    except ValueError:
        pass
    # `2130706433`, `0x7f.1`, `127.1`, `0177.0.0.1` all reach 127.0.0.1 through
    # inet_aton; only the dotted-decimal form is accepted, so nothing hides a target.
    if _NUMERIC_LABEL.match(ascii_name.rsplit(".", 1)[-1]):
        raise UrlRejected("has an IP address in a non-standard notation; use a.b.c.d")
    return None
