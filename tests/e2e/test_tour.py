"""The README's five-minute tour, command by command, as a new user runs it.

Terminal 1 runs the README's `make dev`, terminal 2 its `make listen ...` (both with
PORT set to a free port and the data dir in a temporary folder), and terminal 3's block
runs in bash as written, with the two values a person pastes (the printed key and the
base URL) filled in. The tour's promise is checked where a person would look: terminal 2
prints the credited deposit's webhook, verified; then the portal block runs as written
and Chromium opens the printed URL, signs in and finds that delivery.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.support.chromium import CHROMIUM

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def tour_blocks() -> list[str]:
    """The shell blocks of the README's tour, in order."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## A five-minute tour", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, flags=re.S)


def _commands(block: str) -> list[str]:
    lines = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    return [line for line in lines if line]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Terminal:
    """A command running in its own process group, its output in a file."""

    def __init__(self, command: str, env: dict[str, str], log: Path, cwd: Path) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                ["bash", "-c", command],
                env=env,
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            found = re.search(pattern, self.output())
            if found:
                return found
            if self.proc.poll() is not None:
                raise AssertionError(f"exited before {pattern!r}:\n{self.output()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {pattern!r} after {timeout}s:\n{self.output()[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """The data dir, outside pytest's private tmp: the embedded PostgreSQL runs as its own
    user when started by root, and must be able to reach its files."""
    folder = Path(tempfile.mkdtemp(prefix="settle-tour-"))
    folder.chmod(0o755)
    yield folder / "data"
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def terminals() -> Iterator[list[Terminal]]:
    running: list[Terminal] = []
    yield running
    for terminal in reversed(running):
        terminal.stop()


def test_the_readme_tour_shows_the_credited_webhook_arrive_verified(
    request: pytest.FixtureRequest, tmp_path: Path, data_dir: Path, terminals: list[Terminal]
) -> None:
    # The three terminals (a later block shows the portal, with a person's own values)
    (dev_block, listen_block, tour_block) = tour_blocks()[:3]
    ((dev_command,), (listen_command,)) = _commands(dev_block), _commands(listen_block)
    assert dev_command == "make dev" and listen_command.startswith("make listen")
    port = _free_port()
    data = data_dir
    env = {**os.environ, "SETTLE_DATA_DIR": str(data), "PYTHONUNBUFFERED": "1"}
    env.pop("SETTLE_DATABASE_URL", None)
    env.pop("SETTLE_API_KEY", None)

    # Terminal 1: make dev (on a free port)
    dev = Terminal(f"{dev_command} PORT={port}", env, tmp_path / "dev.log", ROOT)
    terminals.append(dev)
    dev.wait_for(r"Settle is running", 180)
    key = dev.wait_for(r"API key\s+(sk_\S+)", 5).group(1)
    assert json.loads((data / "demo.json").read_text())["apiKey"] == key

    # Terminal 2: make listen EVENTS=... (same port); it finds the demo key itself
    listen = Terminal(f"{listen_command} PORT={port}", env, tmp_path / "listen.log", ROOT)
    terminals.append(listen)
    listen.wait_for(r"Ready: listening on \S+ as endpoint we_", 60)

    # Terminal 3: the tour as written, with the printed key and the base URL pasted in
    script = tour_block.replace("export KEY=sk_...", f"export KEY={key}")
    script = script.replace("B=http://127.0.0.1:8000", f"B=http://127.0.0.1:{port}")
    assert key in script and str(port) in script
    work = tmp_path / "terminal3"
    work.mkdir()
    tour = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert tour.returncode == 0, tour.stdout[-3000:] + tour.stderr[-3000:]
    account = json.loads((work / "account.json").read_text())["depositAccount"]
    assert account["externalUserId"] == "user-42"

    # Then terminal 2 printed the credited deposit's webhook, verified
    line = listen.wait_for(r"verified\s+deposit\.credited\s+evt_dep_(dep_\w+)_credited.*", 120)
    deposit_id = line.group(1)
    assert f"{deposit_id} credited" in line.group(0) and "125.50 USDC" in line.group(0)
    assert "REFUSED" not in listen.output()
    # And the tour's own calls showed the same deposit
    assert deposit_id in tour.stdout

    # And terminal 1 told the same story readably: the deposit's moves and the delivery
    # attempts, one line each, with one timestamp and no colour codes in a file
    console = dev.wait_for(rf"deposit {deposit_id}: \S+ -> credited", 30).string
    assert f"deposit {deposit_id}: source_seen" in console
    attempt = rf"delivery whd_\w+ of evt_dep_{deposit_id}_credited to http://\S+: attempt 1 "
    assert re.search(attempt + r"-> 204 \(succeeded\) in \d+ ms", console), console[-3000:]
    assert re.search(
        r"settle\.http  POST /v1/sandbox/deposits -> 200 in \d+ ms \[req_\w+\]", console
    )
    assert "\033[" not in console
    assert not re.search(r"\d\d:\d\d:\d\d.*\[\d\d/\w+/\d{4}", console)  # werkzeug's own stamp

    # And the README's portal block works as written: the person adds themself as a
    # member (the printed tenant id pasted in), opens the printed URL and signs in
    _open_the_portal(request, dev, env, f"http://127.0.0.1:{port}", tour_blocks()[3])

    # When terminal 2 is stopped, it deletes its endpoint
    listen.stop()
    assert "deleted endpoint we_" in listen.output()


def _open_the_portal(
    request: pytest.FixtureRequest, dev: Terminal, env: dict[str, str], base: str, block: str
) -> None:
    """The tour's portal block in bash, then the portal in Chromium, as a person would."""
    tenant = dev.wait_for(r"tenant\s+([0-9a-f-]{36})", 5).group(1)
    script = block.replace("<the printed tenant id>", tenant)
    assert tenant in script and "settle members add" in script
    password = re.search(r"echo '([^']+)'", script)
    email = re.search(r"--email (\S+)", script)
    assert password and email, script
    added = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert added.returncode == 0, added.stdout[-2000:] + added.stderr[-2000:]
    # `/` is the portal (the README says: open it and sign in)
    opened = requests.get(base + "/", timeout=30)
    assert opened.ok and opened.url == base + "/portal/", opened.url
    if not os.access(CHROMIUM, os.X_OK) and not os.environ.get("CI"):
        # No browser here (CI always has one): the sign-in the page would make, by hand
        signed = requests.post(
            base + "/v1/sessions",
            json={"email": email.group(1), "password": password.group(1)},
            timeout=30,
        )
        assert signed.status_code == 200, signed.text
        return
    # The run's one Chromium (Playwright's sync API allows one), asked for only here: a
    # laptop without it has checked the rest of the tour above.
    browser = request.getfixturevalue("browser")
    context = browser.new_context(base_url=base)
    try:
        page = context.new_page()
        page.set_default_timeout(30_000)
        page.goto("/")
        page.get_by_label("Email").fill(email.group(1))
        page.get_by_label("Password").fill(password.group(1))
        page.get_by_role("button", name="Sign in").click()
        page.get_by_role("heading", name="Overview").wait_for()
        # Then the deliveries the tour made are there: the credited deposit's, succeeded
        page.locator("#nav").get_by_role("link", name="Deliveries").click()
        row = page.get_by_role("row").filter(has_text="deposit.credited")
        row.first.wait_for()
        assert "succeeded" in row.first.inner_text()
    finally:
        context.close()
