"""The clients over TLS, and mutual TLS, to a real service (certificates
made with openssl for 127.0.0.1)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile

import pytest

from conftest import Service
from ctxbudget import AsyncBudgetClient, BudgetClient, BudgetUnavailable, Tls


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki():
    d = tempfile.mkdtemp(prefix="ctxbudget-tls-")
    p = lambda n: os.path.join(d, n)  # noqa: E731
    ext = p("ext.cnf")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
            "-keyout", p("ca.key"), "-out", p("ca.pem"))
    for name in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", p(f"{name}.key"), "-out", p(f"{name}.csr"))
        openssl("x509", "-req", "-in", p(f"{name}.csr"), "-CA", p("ca.pem"), "-CAkey", p("ca.key"), "-CAcreateserial",
                "-days", "2", "-extfile", ext, "-out", p(f"{name}.pem"))
    return p


def config(pki, mutual: bool) -> str:
    extra = f'tls_client_ca = "{pki("ca.pem")}"\n' if mutual else ""
    return f"""
[server]
tls_cert = "{pki("server.pem")}"
tls_key = "{pki("server.key")}"
{extra}
[tiers.t]
max_context_tokens = 1000
default_max_output_tokens = 10
user = {{ requests = [{{ limit = 10, period = "1m" }}] }}
"""


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def ask():
    return dict(tenant="acme", user="u", tier="t", prompt_tokens=10, max_output_tokens=10)


def test_tls_and_mutual_tls(pki):
    service = Service(config(pki, mutual=False), tls_ca=pki("ca.pem"))
    try:
        with BudgetClient(service.target, tls=Tls(root_certificates=read(pki("ca.pem")))) as c:
            assert c.check_and_reserve(**ask()).allowed
        with BudgetClient(service.target, tls=Tls(), timeout=2) as c:
            with pytest.raises(BudgetUnavailable):
                c.check_and_reserve(**ask())  # a CA the system does not trust
    finally:
        service.stop()
    service = Service(config(pki, mutual=True), tls_ca=pki("ca.pem"), client_cert=(pki("client.pem"), pki("client.key")))
    try:
        mtls = Tls(root_certificates=read(pki("ca.pem")), certificate_chain=read(pki("client.pem")),
                   private_key=read(pki("client.key")))

        async def run():
            async with AsyncBudgetClient(service.target, tls=mtls) as c:
                return (await c.check_and_reserve(**ask())).allowed

        assert asyncio.run(run())
        with BudgetClient(service.target, tls=Tls(root_certificates=read(pki("ca.pem"))), timeout=2) as c:
            with pytest.raises(BudgetUnavailable):
                c.check_and_reserve(**ask())  # no client certificate
    finally:
        service.stop()
