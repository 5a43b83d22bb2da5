"""Fixtures: a real ctxbudget service (the repository's binary) on a free port,
started per test module with the module's configuration, and stopped after."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import grpc
import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]


def binary() -> str:
    path = os.environ.get("CTXBUDGET_BIN") or str(REPO / "target" / "debug" / "ctxbudget")
    if not os.path.exists(path):
        pytest.fail(f"no ctxbudget binary at {path}: run `cargo build` first (or set CTXBUDGET_BIN)")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    """A ctxbudget process: its address, and how to stop it."""

    def __init__(
        self,
        config: str,
        *,
        redis_url: str | None = None,
        env: dict[str, str] | None = None,
        tls_ca: str | None = None,
        client_cert: tuple[str, str] | None = None,
        http: bool = False,
        cluster_nodes: list[str] | None = None,
        port: int | None = None,
        extra_args: list[str] | None = None,
    ):
        self.dir = tempfile.mkdtemp(prefix="ctxbudget-py-")
        path = self.config_path = os.path.join(self.dir, "config.toml")
        with open(path, "w") as f:
            f.write(config)
        # A given port: a service restarted where its clients (Envoy) expect it.
        self.port = port or free_port()
        self.target = f"127.0.0.1:{self.port}"
        args = [binary(), "serve", "--listen", self.target, "--config", path]
        if redis_url:
            args += ["--redis-url", redis_url]
        if cluster_nodes:
            args += ["--redis-cluster-nodes", ",".join(cluster_nodes)]
        # The HTTP/JSON API, the admin API and the console, when asked for.
        self.http_url: str | None = None
        if http:
            http_port = free_port()
            self.http_url = f"http://127.0.0.1:{http_port}"
            args += ["--http-listen", f"127.0.0.1:{http_port}"]
        args += extra_args or []
        self.log = open(os.path.join(self.dir, "service.log"), "w")
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("CTXBUDGET_")}
        full_env.update(env or {})
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=full_env)
        if tls_ca is None:
            channel = grpc.insecure_channel(self.target)
        else:
            read = lambda p: open(p, "rb").read()  # noqa: E731
            creds = grpc.ssl_channel_credentials(
                read(tls_ca),
                private_key=read(client_cert[1]) if client_cert else None,
                certificate_chain=read(client_cert[0]) if client_cert else None,
            )
            channel = grpc.secure_channel(self.target, creds)
        try:
            deadline = time.time() + 60
            while True:
                try:
                    grpc.channel_ready_future(channel).result(timeout=0.5)
                    break
                except grpc.FutureTimeoutError:
                    if self.proc.poll() is not None or time.time() > deadline:
                        self.stop()
                        raise RuntimeError(f"ctxbudget did not start: {open(self.log.name).read()}")
        finally:
            channel.close()

    def post_json(self, path: str, body: dict[str, object]) -> tuple[int, dict[str, object]]:
        """POSTs ``body`` as JSON to the HTTP API's ``/v1/<path>``: the status
        and the JSON answer, an error's included."""
        req = urllib.request.Request(
            f"{self.http_url}/v1/{path}", json.dumps(body).encode(), {"content-type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()


def stop_process(proc: subprocess.Popen) -> None:
    """Stops a process this harness started, by its PID: SIGTERM, then
    SIGKILL after 10 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Redis:
    """A redis-server on a free port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too, both below
    32768, where Linux hands out local ports to outgoing connections (one
    could take the bus port between this check and the node's bind)."""
    import random

    for _ in range(1000):
        port = random.randint(20000, 22767)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair for a cluster node")


class RedisCluster:
    """A local Redis Cluster of three masters, formed with redis-cli."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="ctxbudget-cluster-")
        self.ports = [cluster_port() for _ in range(3)]
        self.procs = [
            subprocess.Popen(
                ["redis-server", "--port", str(p), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{p}.conf",
                 "--cluster-node-timeout", "2000", "--dir", self.dir],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for p in self.ports
        ]
        for p in self.ports:
            deadline = time.time() + 10
            while True:
                try:
                    socket.create_connection(("127.0.0.1", p), timeout=0.2).close()
                    break
                except OSError:
                    if time.time() > deadline:
                        raise RuntimeError(f"cluster node {p} did not start")
                    time.sleep(0.05)
        subprocess.run(
            ["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in self.ports],
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 30
        while not all(self._ok(p) for p in self.ports):
            if time.time() > deadline:
                raise RuntimeError("the Redis Cluster did not form")
            time.sleep(0.1)
        self.nodes = [f"redis://127.0.0.1:{p}" for p in self.ports]

    @staticmethod
    def _ok(port: int) -> bool:
        out = subprocess.run(["redis-cli", "-p", str(port), "cluster", "info"], capture_output=True, text=True).stdout
        return "cluster_state:ok" in out

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(timeout=10)


class Uvicorn:
    """A Python ASGI app (``module:app``) served by uvicorn on a free port, in
    its own process, with ``env`` added to the environment; over HTTPS with
    ``tls`` (key file, certificate file)."""

    def __init__(self, app: str, app_dir: str, env: dict[str, str] | None = None,
                 tls: tuple[str, str] | None = None):
        import sys

        self.port = free_port()
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        full_env = dict(os.environ)
        full_env.update(env or {})
        https = ["--ssl-keyfile", tls[0], "--ssl-certfile", tls[1]] if tls else []
        # Idle connections are kept for 5 minutes, as a provider keeps them:
        # with uvicorn's 5 s a client's pool (LiteLLM's aiohttp) could send
        # on a connection the server was closing ("Cannot write to closing
        # transport": a 500 with no retry, seen once in CI).
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", app, "--app-dir", app_dir, "--host", "127.0.0.1",
             "--port", str(self.port), "--log-level", "warning", "--timeout-keep-alive", "300", *https],
            env=full_env,
        )
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"{app} did not start")
                time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
