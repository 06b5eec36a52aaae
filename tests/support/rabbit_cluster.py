"""A three-node RabbitMQ cluster on 127.0.0.1, started natively from Debian's package.

    with RabbitCluster(3) as cluster:
        url = cluster.url()              # every node, SETTLE_AMQP_URL's comma form
        cluster.stop(0)                  # a node goes down (its connections with it)
        cluster.start(0)                 # and comes back into the cluster
        cluster.freeze(2); cluster.kill(0)  # node 0 dies while node 2 is mute (no quorum)

Each node is a `rabbitmq-server` of its own: its node name (`settle-chaos-<n>@localhost`),
AMQP and distribution ports, data and log folders, a configuration of its own (no
plugins, guest allowed from 127.0.0.1), and the cookie all of them share (in a HOME of
the cluster's). Nodes 1.. join node 0. Everything lives in a temporary folder, removed
on exit; every node is stopped, whatever happened. SETTLE_TEST_RABBIT_LOGS=<folder> keeps
the nodes' logs there (a subfolder per cluster).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import pytest

from tests.support.processes import free_port

RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")
#: How long a node may take to start or stop (Erlang on a busy machine).
NODE_WAIT_S = 90


def require_rabbitmq_server() -> Path:
    if (RABBIT_BIN / "rabbitmq-server").exists():
        return RABBIT_BIN
    message = "rabbitmq-server is not installed (apt-get install rabbitmq-server)"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI must install it (see .ci/run)", pytrace=False)
    pytest.skip(message)


class RabbitCluster:
    def __init__(self, size: int = 3) -> None:
        self.bin = require_rabbitmq_server()
        self.folder = Path(tempfile.mkdtemp(prefix="settle-rabbit-"))
        self.home = self.folder / "home"
        self.tag = secrets.token_hex(3)
        self.names = [f"settle-chaos-{self.tag}-{n}@localhost" for n in range(size)]
        self.ports = [free_port() for _ in range(size)]
        self.dist_ports = [free_port() for _ in range(size)]
        self._servers: dict[int, subprocess.Popen[bytes]] = {}
        self._frozen: set[int] = set()

    # -- plumbing ----------------------------------------------------------------------

    def _env(self, n: int) -> dict[str, str]:
        node = self.folder / f"node{n}"
        return {
            **os.environ,
            "HOME": str(self.home),
            "RABBITMQ_NODENAME": self.names[n],
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.ports[n]),
            "RABBITMQ_DIST_PORT": str(self.dist_ports[n]),
            "RABBITMQ_CONF_ENV_FILE": str(self.folder / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(node / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(node / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.folder / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(node / "mnesia"),
            "RABBITMQ_LOG_BASE": str(node / "log"),
            "RABBITMQ_PID_FILE": str(node / "rabbit.pid"),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }

    def ctl(self, n: int, *args: str, timeout: float = NODE_WAIT_S) -> str:
        done = subprocess.run(
            [str(self.bin / "rabbitmqctl"), "-n", self.names[n], *args],
            env=self._env(n),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} on node {n}: {done.stderr}")
        return done.stdout

    # -- life cycle --------------------------------------------------------------------

    def open(self) -> RabbitCluster:
        self.home.mkdir()
        cookie = self.home / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16), encoding="ascii")
        cookie.chmod(0o400)
        (self.folder / "rabbitmq-env.conf").write_text("", encoding="utf-8")
        (self.folder / "enabled_plugins").write_text("[].\n", encoding="utf-8")
        for n in range(len(self.names)):
            node = self.folder / f"node{n}"
            (node / "log").mkdir(parents=True)
            (node / "rabbitmq.conf").write_text(
                f"listeners.tcp.default = 127.0.0.1:{self.ports[n]}\n"
                "loopback_users = none\n"
                # A quiet machine's defaults would refuse publishes on a busy test box.
                "disk_free_limit.absolute = 50MB\n"
                "vm_memory_high_watermark.relative = 0.8\n",
                encoding="utf-8",
            )
            (node / "advanced.config").write_text("[].\n", encoding="utf-8")
        # All at once (Erlang takes its time to boot), then nodes 1.. join node 0.
        for n in range(len(self.names)):
            self._launch(n)
        for n in range(len(self.names)):
            self._await(n)
        for n in range(1, len(self.names)):
            self.ctl(n, "stop_app")
            self.ctl(n, "join_cluster", self.names[0])
            self.ctl(n, "start_app")
            self._await(n)
        return self

    def start(self, n: int) -> float:
        """Start node `n` again (it rejoins its cluster); returns the seconds until it
        serves AMQP."""
        started = time.monotonic()
        self._launch(n)
        self._await(n)
        return time.monotonic() - started

    def _launch(self, n: int) -> None:
        log = (self.folder / f"node{n}" / "server.out").open("ab")
        self._servers[n] = subprocess.Popen(
            [str(self.bin / "rabbitmq-server")],
            env=self._env(n),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def _await(self, n: int) -> None:
        """Until node `n` runs (it registers with epmd a moment after it starts)."""
        deadline = time.monotonic() + NODE_WAIT_S
        while True:
            try:
                self.ctl(n, "await_startup", timeout=NODE_WAIT_S)
                return
            except RuntimeError:
                server = self._servers.get(n)
                if time.monotonic() > deadline or (server and server.poll() is not None):
                    out = (self.folder / f"node{n}" / "server.out").read_text(errors="replace")
                    raise RuntimeError(f"node {n} did not start:\n{out[-2000:]}") from None
                time.sleep(0.5)

    def stop(self, n: int) -> float:
        """Stop node `n` (its clients' connections drop); returns the seconds it took."""
        started = time.monotonic()
        with contextlib.suppress(Exception):
            self.ctl(n, "stop")
        server = self._servers.pop(n, None)
        if server is not None:
            try:
                server.wait(NODE_WAIT_S)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(10)
        return time.monotonic() - started

    def kill(self, n: int) -> None:
        """Node `n` dies at once (SIGKILL to its process group): no goodbye to its peers."""
        server = self._servers.pop(n)
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(NODE_WAIT_S)

    def freeze(self, n: int) -> None:
        """Node `n` stops answering (SIGSTOP) until `thaw(n)`: alive to its peers, mute."""
        os.killpg(self._servers[n].pid, signal.SIGSTOP)
        self._frozen.add(n)

    def thaw(self, n: int) -> None:
        os.killpg(self._servers[n].pid, signal.SIGCONT)
        self._frozen.discard(n)

    def running_nodes(self, n: int) -> list[str]:
        out = self.ctl(n, "eval", "rabbit_nodes:all_running().")
        return [name for name in self.names if name in out]

    def close(self) -> None:
        for n in list(self._frozen):
            self.thaw(n)
        for n in list(self._servers):
            self.stop(n)
        keep = os.environ.get("SETTLE_TEST_RABBIT_LOGS")
        if keep:
            # The nodes' logs outlive the cluster, for a failure to be read after it (leader
            # elections, refused publishes, who connected where)
            shutil.copytree(
                self.folder,
                Path(keep) / self.tag,
                ignore=shutil.ignore_patterns("mnesia", "home"),
                dirs_exist_ok=True,
            )
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> RabbitCluster:
        try:
            return self.open()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- addresses -----------------------------------------------------------------------

    def url(self) -> str:
        """SETTLE_AMQP_URL for the whole cluster, node 0 first."""
        first, *rest = self.ports
        return f"amqp://guest:guest@127.0.0.1:{first}/%2F," + ",".join(
            f"127.0.0.1:{port}" for port in rest
        )
