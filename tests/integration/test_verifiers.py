"""The receivers' verifiers (clients/, docs/examples/verify/) against deliveries Settle made.

The pipeline (outbox -> relay -> RabbitMQ -> consumer -> worker) delivers real events
to a receiver on 127.0.0.1; a secret is rotated with an overlap, so one delivery
carries two signatures. What arrived, plus forgeries made from it, becomes a vectors
file. Then:

- the Python package is built as a wheel, installed into a directory of its own and its
  own suite (clients/python/tests) runs against the vectors;
- the npm package is packed, the tarball installed, and its own suite (clients/node/test)
  runs against the vectors;
- each documented snippet (Go, Ruby, PHP, Java, C#) runs on every vector, when its tool
  chain is on this machine (`.ci/run` installs them from Debian's packages).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from services.notifier.secrets import new_secret as new_standard_secret
from shared import event_catalog, events, signing
from tests.conftest import make_tenant
from tests.support.pipeline import isolated_database, running_pipeline
from tests.support.receiver import Receiver
from tests.support.services import require_rabbitmq

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SNIPPETS = ROOT / "docs" / "examples" / "verify"
WEBHOOKS_DOC = ROOT / "docs" / "WEBHOOKS.md"
#: The npm `standardwebhooks` the Node package is checked against (pinned).
NPM_STANDARDWEBHOOKS = "1.1.1"


@dataclass(frozen=True)
class Vector:
    name: str
    secret: str
    headers: dict[str, str]
    body: bytes
    valid: bool
    now: int

    def document(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "secret": self.secret,
            "headers": self.headers,
            "body": base64.b64encode(self.body).decode(),
            "valid": self.valid,
            "now": self.now,
        }


def _forgeries(real: Vector, other_secret: str) -> list[Vector]:
    """Deliveries a receiver must refuse, made from a real one."""
    ts = int(real.headers[signing.TIMESTAMP_HEADER])
    flipped = bytearray(real.body)
    flipped[len(flipped) // 2] ^= 0x01

    def resigned(at: int) -> dict[str, str]:
        # Signed correctly with the real secret, by Settle's own signer, at another time.
        headers = dict(real.headers)
        headers[signing.TIMESTAMP_HEADER] = str(at)
        headers[signing.SIGNATURE_HEADER] = signing.signature_header([real.secret], at, real.body)
        return headers

    def with_signature(value: str) -> dict[str, str]:
        return {**real.headers, signing.SIGNATURE_HEADER: value}

    def forged(name: str, **changes: Any) -> Vector:
        values = {**real.__dict__, "name": f"{real.name}: {name}", "valid": False, **changes}
        return Vector(**values)

    signature = real.headers[signing.SIGNATURE_HEADER]
    return [
        forged("one bit of the body flipped", body=bytes(flipped)),
        forged("a byte appended", body=real.body + b" "),
        forged("verified with another secret", secret=other_secret),
        forged("replayed 1000 s later", headers=resigned(ts - 1000)),
        forged("dated 1000 s ahead", headers=resigned(ts + 1000)),
        forged(
            "timestamp changed, signature kept",
            headers={**real.headers, "x-service-timestamp": str(ts + 1)},
        ),
        forged("scheme v0", headers=with_signature(signature.replace("v1=", "v0="))),
        forged(
            "signature without its scheme", headers=with_signature(signature.replace("v1=", ""))
        ),
        forged(
            "signature upper-cased", headers=with_signature(signature.upper().replace("V1=", "v1="))
        ),
        forged("signature cut short", headers=with_signature(signature[:40])),
    ]


@pytest.fixture(scope="module")
def vectors_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    require_rabbitmq()
    vectors: list[Vector] = []
    with (
        isolated_database("verifiers") as url,
        running_pipeline(url) as pipeline,
        Receiver() as rx,
    ):
        # Given an endpoint for deposit and account events, with a non-ASCII payload to send
        tenant_id = make_tenant(pipeline.db).tenant_id
        types = [events.DEPOSIT_CREDITED, events.ACCOUNT_CREATED]
        endpoint_id, first_secret = pipeline.endpoint(tenant_id, rx.url("/hook"), types)
        std_id, std_first = pipeline.endpoint(
            tenant_id, rx.url("/std"), types, signature_scheme=signing.STANDARD
        )
        account = event_catalog.get(events.ACCOUNT_CREATED).example["data"]  # a copy
        account["depositAccount"]["metadata"] = {"note": 'grüße ✓ \u2028 "quoted" </script>'}
        credited = event_catalog.get(events.DEPOSIT_CREDITED).example["data"]

        # When core emits two events, then the secret is rotated (old one kept an hour)
        # and a third is emitted
        pipeline.emit(tenant_id, events.ACCOUNT_CREATED, account)
        pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, credited)
        assert rx.wait_for(lambda r: len(r.hits("/hook")) >= 2 and len(r.hits("/std")) >= 2, 20)
        new_secret = pipeline.rotate(endpoint_id, overlap_s=3600)
        std_new = pipeline.rotate(std_id, overlap_s=3600)
        pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, credited)
        assert rx.wait_for(lambda r: len(r.hits("/hook")) >= 3 and len(r.hits("/std")) >= 3, 20)
        hits = rx.hits("/hook")
        std_hits = rx.hits("/std")

    now = int(time.time())
    before, after = hits[:2], hits[2:]
    for n, hit in enumerate(before):
        vectors.append(Vector(f"delivery {n}", first_secret, hit.headers, hit.body, True, now))
    (rotated,) = after
    assert "," in rotated.headers[signing.SIGNATURE_HEADER], "the overlap signs with both"
    for label, secret in (("new", new_secret), ("old", first_secret)):
        vectors.append(
            Vector(f"rotated, {label} secret", secret, rotated.headers, rotated.body, True, now)
        )
    real = [v for v in vectors if v.valid]
    for vector in real:
        vectors += _forgeries(vector, other_secret="whsec_" + "A" * 43)
    path = tmp_path_factory.mktemp("vectors") / "deliveries.json"
    path.write_text(json.dumps([v.document() for v in vectors], indent=1), encoding="utf-8")
    # The standard endpoint's deliveries (before and during its rotation overlap) and
    # forgeries of them, beside: standard.json
    standard: list[Vector] = []
    for n, hit in enumerate(std_hits[:2]):
        standard.append(Vector(f"standard {n}", std_first, hit.headers, hit.body, True, now))
    rotated_std = std_hits[2]
    assert " " in rotated_std.headers[signing.STANDARD_SIGNATURE_HEADER], "both secrets sign"
    for label, secret in (("new", std_new), ("old", std_first)):
        standard.append(
            Vector(
                f"standard rotated, {label}",
                secret,
                rotated_std.headers,
                rotated_std.body,
                True,
                now,
            )
        )
    for real_std in list(standard):
        standard += [
            dataclasses.replace(real_std, name=f"{real_std.name}: a byte changed", valid=False,
                                body=real_std.body.replace(b"}", b" }", 1)),
            dataclasses.replace(real_std, name=f"{real_std.name}: another secret", valid=False,
                                secret=new_standard_secret()),
            dataclasses.replace(real_std, name=f"{real_std.name}: another webhook-id",
                                valid=False, headers={**real_std.headers, "webhook-id": "evt_x"}),
        ]  # fmt: skip
    (path.parent / "standard.json").write_text(
        json.dumps([v.document() for v in standard], indent=1), encoding="utf-8"
    )
    yield path


def _run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False, **kwargs)


def _suite_env(vectors_file: Path, **extra: str) -> dict[str, str]:
    # CI=1: inside the suites, a missing vectors file fails rather than skips.
    return {**os.environ, "SETTLE_WEBHOOK_VECTORS": str(vectors_file), "CI": "1", **extra}


#: Run by a fresh virtualenv's own Python with nothing but the installed package: every
#: vector of the file must verify or be refused as it says; prints the count checked.
_VERIFY_VECTORS = """
import base64, json, sys
import settle_webhooks
check = getattr(settle_webhooks, sys.argv[2])  # verify, or verify_standard
checked = 0
for v in json.load(open(sys.argv[1], encoding="utf-8")):
    body = base64.b64decode(v["body"])
    try:
        check(v["secret"], v["headers"], body, now=v["now"])
        ok = True
    except settle_webhooks.WebhookVerificationError:
        ok = False
    if ok != v["valid"]:
        sys.exit(f"{v['name']}: verified={ok}, expected {v['valid']}")
    checked += 1
print(checked, settle_webhooks.__version__, settle_webhooks.__file__)
"""


def _fresh_venv(where: Path) -> Path:
    """A new virtualenv outside the repository (its own pip); its Python."""
    made = _run([sys.executable, "-m", "venv", str(where)])
    assert made.returncode == 0, made.stderr
    return where / "bin" / "python"


def _version_of_source() -> str:
    text = (ROOT / "clients" / "python" / "src" / "settle_webhooks" / "__init__.py").read_text()
    (version,) = re.findall(r'^__version__ = "([^"]+)"', text, re.M)
    return version


def test_the_python_package_installs_and_passes_its_suite_on_real_deliveries(
    vectors_file: Path, tmp_path: Path
) -> None:
    # Given the package built as a wheel and an sdist by `python -m build` from a copy of
    # its sources outside the repository
    source = tmp_path / "src"
    shutil.copytree(ROOT / "clients" / "python", source)
    built = _run(
        [sys.executable, "-m", "build", "--no-isolation", "-o", str(tmp_path / "dist"),
         str(source)]
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    version = _version_of_source()
    (wheel,) = (tmp_path / "dist").glob(f"settle_webhooks-{version}-py3-none-any.whl")
    (sdist,) = (tmp_path / "dist").glob(f"settle[-_]webhooks-{version}.tar.gz")
    # Each carries its licence and README (the wheel's METADATA holds the README)
    with zipfile.ZipFile(wheel) as zipped:
        names = zipped.namelist()
        assert f"settle_webhooks-{version}.dist-info/LICENSE" in names, names
        metadata = zipped.read(f"settle_webhooks-{version}.dist-info/METADATA").decode()
        assert f"Version: {version}" in metadata and "settle_webhooks import" in metadata
    with tarfile.open(sdist) as tarred:
        names = tarred.getnames()
    for member in ("LICENSE", "README.md", "pyproject.toml", "src/settle_webhooks/__init__.py"):
        assert f"{sdist.name.removesuffix('.tar.gz')}/{member}" in names, (member, names)

    # (`python -m build` makes the wheel from the sdist, so the sdist builds too)

    # When the wheel is installed into a fresh virtualenv (offline, no dependencies)
    python = _fresh_venv(tmp_path / "venv")
    installed = _run(
        [str(python), "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(wheel)]
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    # Then that virtualenv's Python alone verifies every real delivery and refuses every
    # forgery, with the installed copy
    for vectors, function in (
        (vectors_file, "verify"),
        (vectors_file.parent / "standard.json", "verify_standard"),  # signatureScheme standard
    ):
        checked = _run([str(python), "-c", _VERIFY_VECTORS, str(vectors), function], cwd=tmp_path)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        count, shown_version, where = checked.stdout.split()
        assert int(count) >= 10 and shown_version == version
        assert where.startswith(str(tmp_path / "venv")), where

    # And the package's own suite passes against that installed copy
    site = next((tmp_path / "venv" / "lib").glob("python*/site-packages"))
    suite = _run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
         str(source), "-c", str(source / "pyproject.toml"), str(source / "tests")],
        env=_suite_env(vectors_file, PYTHONPATH=str(site)),
        cwd=tmp_path,
    )  # fmt: skip
    assert suite.returncode == 0, suite.stdout + suite.stderr
    assert "skipped" not in suite.stdout and " passed" in suite.stdout, suite.stdout


def _need(tool: str) -> str:
    found = shutil.which(tool)
    if found is None:
        pytest.skip(f"{tool} is not installed (.ci/run installs it)")
    return found


def test_the_node_package_packs_installs_and_passes_its_suite_on_real_deliveries(
    vectors_file: Path, tmp_path: Path
) -> None:
    npm = _need("npm")
    node = _need("node")
    # Given the npm package packed as a tarball and installed into an app of its own
    packed = _run(
        [npm, "pack", str(ROOT / "clients" / "node"), "--pack-destination", str(tmp_path)]
    )
    assert packed.returncode == 0, packed.stderr
    (tarball,) = tmp_path.glob("settle-webhooks-*.tgz")
    app = tmp_path / "app"
    installed = _run(
        [npm, "install", "--offline", "--no-audit", "--no-fund", "--prefix", str(app), str(tarball)]
    )
    assert installed.returncode == 0, installed.stderr
    package = app / "node_modules" / "settle-webhooks"
    assert sorted(p.name for p in package.iterdir()) == [
        "LICENSE", "README.md", "index.d.ts", "index.js", "index.mjs", "package.json",
    ]  # fmt: skip
    version = json.loads((ROOT / "clients" / "node" / "package.json").read_text())["version"]
    assert tarball.name == f"settle-webhooks-{version}.tgz"
    # Both module systems load it
    for code in (
        "const v = require('settle-webhooks'); if (typeof v.verify !== 'function') process.exit(1)",
        "import('settle-webhooks')"
        ".then(v => { if (typeof v.verify !== 'function') process.exit(1) })",
    ):
        loaded = _run([node, "-e", code], cwd=app)
        assert loaded.returncode == 0, loaded.stderr

    # When its own suite runs against the installed copy and the real deliveries
    shutil.copytree(ROOT / "clients" / "node" / "test", package / "test")
    suite = _run([node, "--test", "test/"], cwd=package, env=_suite_env(vectors_file))

    # Then every test passes and none is skipped
    assert suite.returncode == 0, suite.stdout + suite.stderr
    assert "# fail 0" in suite.stdout and "# skipped 0" in suite.stdout, suite.stdout


#: Run in the app folder: each standard vector through our verifyStandard and through npm
#: `standardwebhooks`' Webhook, unchanged; both must agree with the vector. Prints the count.
_NODE_STANDARD = """
const fs = require('fs');
const ours = require('settle-webhooks');
const { Webhook } = require('standardwebhooks');
let checked = 0;
for (const v of JSON.parse(fs.readFileSync(process.argv[1], 'utf8'))) {
  const body = Buffer.from(v.body, 'base64');
  let mine = true, theirs = true;
  try {
    ours.verifyStandard(v.secret, v.headers, body, { now: v.now });
  } catch (e) { mine = false; }
  try {
    new Webhook(v.secret).verify(body.toString('utf8'), v.headers);
  } catch (e) { theirs = false; }
  if (mine !== v.valid || theirs !== v.valid) {
    console.error(`${v.name}: ours ${mine}, standardwebhooks ${theirs}, expected ${v.valid}`);
    process.exit(1);
  }
  checked += 1;
}
console.log(checked);
"""


def test_the_node_package_agrees_with_npm_standardwebhooks_on_standard_deliveries(
    vectors_file: Path, tmp_path: Path
) -> None:
    npm = _need("npm")
    node = _need("node")
    # Given the packed tarball and npm's `standardwebhooks`, installed into a fresh folder
    packed = _run(
        [npm, "pack", str(ROOT / "clients" / "node"), "--pack-destination", str(tmp_path)]
    )
    assert packed.returncode == 0, packed.stderr
    (tarball,) = tmp_path.glob("settle-webhooks-*.tgz")
    app = tmp_path / "app"
    installed = _run(
        [npm, "install", "--no-audit", "--no-fund", "--prefix", str(app), str(tarball),
         f"standardwebhooks@{NPM_STANDARDWEBHOOKS}"]
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout + installed.stderr
    # When both verify a standard endpoint's real deliveries (before and during a
    # rotation overlap) and their forgeries
    checked = _run(
        [node, "-e", _NODE_STANDARD, str(vectors_file.parent / "standard.json")], cwd=app
    )
    # Then they agree with each other and with what each vector is
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert int(checked.stdout.strip()) >= 16


# -- the documented snippets --------------------------------------------------------


@dataclass(frozen=True)
class Snippet:
    file: str
    tools: tuple[str, ...]
    #: Builds the program in a directory; returns the command that runs it.
    build: Callable[[Path, Path], list[str]]


def _go(source: Path, out: Path) -> list[str]:
    env = {**os.environ, "GOCACHE": str(out / "gocache"), "GO111MODULE": "off"}
    built = _run(["go", "build", "-o", str(out / "verify"), str(source)], env=env)
    assert built.returncode == 0, built.stderr
    return [str(out / "verify")]


def _java(source: Path, out: Path) -> list[str]:
    built = _run(["javac", "-d", str(out), str(source)])
    assert built.returncode == 0, built.stderr
    return ["java", "-cp", str(out), "Verify"]


def _csharp(source: Path, out: Path) -> list[str]:
    built = _run(["mcs", f"-out:{out / 'Verify.exe'}", str(source)])
    assert built.returncode == 0, built.stdout + built.stderr
    return ["mono", str(out / "Verify.exe")]


SNIPPET_LIST = [
    Snippet("verify.go", ("go",), _go),
    Snippet("verify.rb", ("ruby",), lambda source, out: ["ruby", str(source)]),
    Snippet("verify.php", ("php",), lambda source, out: ["php", str(source)]),
    Snippet("Verify.java", ("javac", "java"), _java),
    Snippet("Verify.cs", ("mcs", "mono"), _csharp),
]


@pytest.mark.parametrize("snippet", SNIPPET_LIST, ids=lambda s: s.file)
def test_each_documented_snippet_accepts_real_deliveries_and_refuses_forgeries(
    snippet: Snippet, vectors_file: Path, tmp_path: Path
) -> None:
    for tool in snippet.tools:
        _need(tool)
    command = snippet.build(SNIPPETS / snippet.file, tmp_path)
    vectors = json.loads(vectors_file.read_text(encoding="utf-8"))
    wrong = []
    for n, vector in enumerate(vectors):
        body = tmp_path / f"body-{n}"
        body.write_bytes(base64.b64decode(vector["body"]))
        headers = vector["headers"]
        ran = _run(
            [*command, vector["secret"], headers["x-service-timestamp"],
             headers["x-service-signature"], str(body)]
        )  # fmt: skip
        if (ran.returncode == 0) != vector["valid"] or ran.returncode not in (0, 1):
            wrong.append((vector["name"], ran.returncode, ran.stderr[-300:]))
    assert wrong == []


@pytest.mark.parametrize("snippet", SNIPPET_LIST, ids=lambda s: s.file)
def test_an_empty_secret_never_verifies(snippet: Snippet, tmp_path: Path) -> None:
    for tool in snippet.tools:
        _need(tool)
    command = snippet.build(SNIPPETS / snippet.file, tmp_path)
    body = tmp_path / "body"
    body.write_bytes(b"{}")
    ts = int(time.time())
    signature = signing.signature_header(["x"], ts, b"{}")
    ran = _run([*command, "", str(ts), signature, str(body)])
    assert ran.returncode != 0 and "verified" not in ran.stdout


def test_the_docs_show_exactly_the_tested_snippets() -> None:
    text = WEBHOOKS_DOC.read_text(encoding="utf-8")
    for snippet in SNIPPET_LIST:
        source = (SNIPPETS / snippet.file).read_text(encoding="utf-8")
        assert source in text, f"docs/WEBHOOKS.md does not show {snippet.file} as it is"
