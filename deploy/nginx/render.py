"""Render deploy/nginx/settle.conf.template into a runnable nginx.conf.

Only the named `${NAME}` placeholders are replaced; every other `$...` (nginx's own
variables such as `$host` or `$request_id`) is left alone, like `envsubst` given an
explicit variable list.

    python deploy/nginx/render.py --core 127.0.0.1:8000 --notifier 127.0.0.1:8001 \\
        --port 8080 --tls-port 8443 --tls-cert fullchain.pem --tls-key privkey.pem \\
        --run-dir /tmp/x > nginx.conf
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

TEMPLATE = Path(__file__).with_name("settle.conf.template")
#: The placeholders settle.conf.template uses; the CLI fills in all of them.
PLACEHOLDERS = (
    "CORE_UPSTREAM",
    "NOTIFIER_UPSTREAM",
    "LISTEN_PORT",
    "TLS_LISTEN",
    "TLS_CERT",
    "TLS_KEY",
    "HTTPS_REDIRECT",
    "PUBLIC_HTTPS_PORT",
    "NGINX_RUN_DIR",
)

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# Characters that would end or open an nginx directive or block if substituted in.
_UNSAFE = re.compile(r"[\s;{}\"'#$\\]")


def render(template_text: str, values: Mapping[str, str]) -> str:
    """Replace `${NAME}` for each NAME in `values`; leave everything else as it is."""
    out = template_text
    for name, value in values.items():
        if not _NAME.fullmatch(name):
            raise ValueError(f"not a placeholder name: {name!r}")
        value = str(value)
        if not value or _UNSAFE.search(value):
            raise ValueError(f"unsafe value for {name}: {value!r}")
        out = out.replace("${" + name + "}", value)
    return out


def unfilled(text: str) -> list[str]:
    """Every `${NAME}` placeholder still in `text` (the template writes nginx's own
    variables without braces, so any left is a placeholder nobody filled in)."""
    return sorted(set(_PLACEHOLDER.findall(text)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--core", required=True, help="core API upstream, host:port")
    parser.add_argument("--notifier", required=True, help="notifier API upstream, host:port")
    parser.add_argument("--port", required=True, type=int, help="port of plain HTTP")
    parser.add_argument("--tls-port", required=True, type=int, help="port of HTTPS")
    parser.add_argument("--tls-cert", required=True, type=Path, help="certificate chain, PEM")
    parser.add_argument("--tls-key", required=True, type=Path, help="its private key, PEM")
    parser.add_argument(
        "--https-redirect",
        choices=("on", "off"),
        default="on",
        help="plain HTTP answers 308 to HTTPS (off: served as is, behind a TLS proxy)",
    )
    parser.add_argument(
        "--public-https-port", type=int, help="HTTPS port in the redirect (default --tls-port)"
    )
    parser.add_argument("--run-dir", required=True, help="writable dir: pid file, temp files")
    parser.add_argument("--template", type=Path, default=TEMPLATE)
    parser.add_argument("-o", "--output", type=Path, help="write here instead of stdout")
    args = parser.parse_args(argv)

    values = {
        "CORE_UPSTREAM": args.core,
        "NOTIFIER_UPSTREAM": args.notifier,
        "LISTEN_PORT": str(args.port),
        "TLS_LISTEN": str(args.tls_port),
        "TLS_CERT": str(args.tls_cert.absolute()),
        "TLS_KEY": str(args.tls_key.absolute()),
        "HTTPS_REDIRECT": "1" if args.https_redirect == "on" else "0",
        "PUBLIC_HTTPS_PORT": str(args.public_https_port or args.tls_port),
        "NGINX_RUN_DIR": str(Path(args.run_dir).absolute()),
    }
    try:
        text = render(args.template.read_text(encoding="utf-8"), values)
    except ValueError as err:
        parser.error(str(err))
    missing = unfilled(text)
    if missing:
        parser.error(f"template still has placeholders: {', '.join(missing)}")
    if args.output:
        args.output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
