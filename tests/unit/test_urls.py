"""The webhook URL policy checked when an endpoint is created or changed."""

from __future__ import annotations

import pytest

from services.notifier.urls import MAX_URL_LENGTH, UrlRejected, check_url


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/settle",
        "https://hooks.example.com",
        "https://hooks.example.com:8443/settle?tenant=a&x=1",
        "https://8.8.8.8/hook",
        "https://[2001:4860:4860::8888]/hook",
        "https://bücher.example/hook",
        "https://example.com./hook",
        "https://a-b_c.example.co.uk/x/y",
    ],
)
def test_public_https_urls_are_admitted(url: str) -> None:
    # Given a public https URL, When it is checked, Then it comes back unchanged
    assert check_url(url, allow_private=False) == url


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://hooks.example.com/settle", "https"),
        ("ftp://hooks.example.com/settle", "https"),
        ("hooks.example.com/settle", "https"),
        ("https://user:pass@hooks.example.com/", "credentials"),
        ("https://token@hooks.example.com/", "credentials"),
        ("https://hooks.example.com/settle#frag", "fragment"),
        ("https://hooks.example.com/settle#", "fragment"),
        ("https://hooks.example.com:0/", "port"),
        ("https://hooks.example.com:99999/", "valid URL"),
        ("https://hooks.example.com:abc/", "valid URL"),
        ("https:///nohost", "host"),
        ("https://hooks example.com/", "spaces"),
        ("https://hooks.example.com/\n", "spaces"),
        ("https://" + "a" * MAX_URL_LENGTH + ".com/", "at most"),
        ("https://127.0.0.1/hook", "private"),
        ("https://10.1.2.3/hook", "private"),
        ("https://172.16.0.1/hook", "private"),
        ("https://192.168.1.1/hook", "private"),
        ("https://169.254.169.254/latest/meta-data", "private"),
        ("https://100.100.100.200/", "private"),
        ("https://0.0.0.0/", "private"),
        ("https://224.0.0.1/", "private"),
        ("https://255.255.255.255/", "private"),
        ("https://[::1]/hook", "private"),
        ("https://[fd00:ec2::254]/", "private"),
        ("https://[fe80::1]/", "private"),
        ("https://[::ffff:127.0.0.1]/", "private"),
        ("https://[2002:7f00:1::]/", "private"),
        ("https://[64:ff9b::7f00:1]/", "private"),
        ("https://[not-ipv6]/", "not a valid URL"),
        ("https://2130706433/", "notation"),
        ("https://0x7f000001/", "notation"),
        ("https://127.1/", "notation"),
        ("https://0177.0.0.1/", "notation"),
        ("https://localhost/hook", "local"),
        ("https://LOCALHOST./hook", "local"),
        ("https://api.localhost/hook", "local"),
        ("https://metadata.google.internal/", "local"),
        ("https://printer.local/", "local"),
        ("https://intranet/hook", "fully qualified"),
        ("https://-bad-.example.com/", "not valid"),
        ("https://exa$mple.com/", "not valid"),
    ],
)
def test_urls_breaking_the_policy_are_refused(url: str, reason: str) -> None:
    # Given a URL that breaks the policy, When it is checked, Then the message says why
    with pytest.raises(UrlRejected, match=reason):
        check_url(url, allow_private=False)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/hook",
        "http://localhost:5000/hook",
        "https://10.0.0.5/hook",
        "http://[::1]:9000/",
        "http://receiver/hook",
    ],
)
def test_dev_admits_http_and_private_hosts(url: str) -> None:
    # Given SETTLE_WEBHOOK_ALLOW_PRIVATE, When a local URL is checked, Then it is admitted
    assert check_url(url, allow_private=True) == url


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("ftp://127.0.0.1/", "https or http"),
        ("http://u:p@127.0.0.1/", "credentials"),
        ("http://127.0.0.1/#x", "fragment"),
        ("http://0x7f.1/", "notation"),
    ],
)
def test_dev_still_refuses_other_schemes_credentials_and_odd_notation(
    url: str, reason: str
) -> None:
    with pytest.raises(UrlRejected, match=reason):
        check_url(url, allow_private=True)


def test_non_strings_are_refused() -> None:
    with pytest.raises(UrlRejected):
        check_url(None, allow_private=False)
    with pytest.raises(UrlRejected):
        check_url("", allow_private=False)


# -- hostile hosts: the check judges the host the way an HTTP client will read it -------


@pytest.mark.parametrize(
    "url",
    [
        "https://\uff11\uff12\uff17.\uff10.\uff10.\uff11/hook",  # fullwidth digits: 127.0.0.1
        "https://127\u30020\u30020\u30021/hook",  # ideographic full stops
        "https://127\uff0e0\uff0e0\uff0e1/hook",  # fullwidth full stops
        "https://10\uff610\uff610\uff611/hook",  # halfwidth ideographic full stops
        "https://\uff11\uff16\uff19.\uff12\uff15\uff14.\uff11\uff16\uff19.\uff12\uff15\uff14/",
        "https://\uff11\uff12\uff17.\uff11/",  # fullwidth 127.1
        "https://localhost\u3002/hook",
        "https://\uff4d\uff45\uff54\uff41\uff44\uff41\uff54\uff41.google.internal/",
        "https://[fec0::1]/hook",  # site-local IPv6 (deprecated, still routed inside sites)
        "https://[fec0::]/",
        "https://[feff:ffff::1]/",
        "https://[3fff::1]/",  # documentation (RFC 9637)
        "https://[2001:db8::1]/",
        "https://192.0.0.8/",
        "https://192.88.99.1/",
        "https://198.51.100.7/",
        "https://[64:ff9b::a00:1]/",  # NAT64 of 10.0.0.1
        "https://[64:ff9b:1::1]/",
        "https://[::7f00:1]/",  # IPv4-compatible 127.0.0.1
        "https://[fe80::1%25eth0]/",
    ],
)
def test_non_public_hosts_in_any_spelling_are_refused(url: str) -> None:
    # Given a URL whose host is a non-global address however it is written
    # When it is checked outside dev, Then it is refused (twelve of these passed before)
    with pytest.raises(UrlRejected):
        check_url(url, allow_private=False)


@pytest.mark.parametrize(
    ("url", "normal"),
    [
        ("https://hooks\u3002example.com/x", "hooks.example.com"),
        ("https://\uff48\uff4f\uff4f\uff4b\uff53.example.com/", "hooks.example.com"),
        ("https://b\u00fccher\uff0eexample/hook", "b\u00fccher.example"),
    ],
)
def test_public_hosts_in_a_non_normal_spelling_are_refused_with_the_normal_form(
    url: str, normal: str
) -> None:
    # Given a public host written with fullwidth letters or ideographic dots, which the
    # sender's HTTP client would not read the same way
    # When it is checked, Then it is refused with the spelling to use instead
    with pytest.raises(UrlRejected, match=normal):
        check_url(url, allow_private=False)


@pytest.mark.parametrize(
    "url",
    ["https://[2001:4860:4860::8888]/hook", "https://[64:ff9b::808:808]/", "https://1.1.1.1/"],
)
def test_global_literals_are_still_admitted(url: str) -> None:
    assert check_url(url, allow_private=False) == url


def test_the_creation_check_and_the_send_time_guard_agree() -> None:
    # Given every address the send-time guard refuses in its tables
    from services.notifier import sender

    samples = [net.network_address + 1 for net in sender._NON_PUBLIC if net.num_addresses > 1]
    samples += list(sender.METADATA_ADDRESSES)
    for address in samples:
        host = f"[{address}]" if address.version == 6 else str(address)
        # Then the creation check refuses each as well
        with pytest.raises(UrlRejected):
            check_url(f"https://{host}/", allow_private=False)


def test_dev_admits_site_local_but_not_a_non_normal_spelling() -> None:
    assert check_url("https://[fec0::1]/", allow_private=True) == "https://[fec0::1]/"
    with pytest.raises(UrlRejected, match=r"127\.0\.0\.1"):
        check_url("http://127\u30020\u30020\u30021/", allow_private=True)
