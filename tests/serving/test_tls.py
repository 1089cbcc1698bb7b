"""app.serving.tls: HTTPS through a real uvicorn server, certificate rotation by symlink swap, bad files."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from app.api.auth import KubeReviewer
from app.config import Settings
from app.serving.tls import (
    CertificateReloader,
    TLSConfigError,
    load_tls,
    new_server_context,
    uvicorn_tls_kwargs,
    watch_certificates,
)
from tests.support.auth_rig import OPENSSL, PROM_TOKEN, CertPair, bearer, make_cert, protected_app

pytestmark = pytest.mark.skipif(OPENSSL is None, reason="openssl CLI not available")


class SecretVolume:
    """A directory laid out like a mounted Kubernetes Secret: tls.crt -> ..data/tls.crt, ..data -> ..<ts>.

    ``publish`` swaps ``..data`` atomically (rename of a symlink), as the kubelet's AtomicWriter does.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.generation = 0

    @property
    def cert(self) -> Path:
        return self.root / "tls.crt"

    @property
    def key(self) -> Path:
        return self.root / "tls.key"

    def publish(self, cert: bytes, key: bytes) -> None:
        self.generation += 1
        data = self.root / f"..gen_{self.generation}"
        data.mkdir()
        (data / "tls.crt").write_bytes(cert)
        (data / "tls.key").write_bytes(key)
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(data.name)
        os.replace(tmp, self.root / "..data")
        for name in ("tls.crt", "tls.key"):
            if not (self.root / name).is_symlink():
                (self.root / name).symlink_to(f"..data/{name}")

    def publish_pair(self, pair: CertPair) -> None:
        self.publish(pair.cert.read_bytes(), pair.key.read_bytes())


def trusting(pair: CertPair) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=pair.cert_pem)
    return ctx


async def peer_certificate(port: int) -> bytes:
    """DER of the certificate a fresh TLS handshake presents (no verification: we compare bytes)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    _reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        assert der is not None
        return bytes(der)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


def der(pair: CertPair) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pair.cert_pem)


@contextlib.asynccontextmanager
async def serve_https(app: FastAPI, tls: CertificateReloader) -> AsyncIterator[int]:
    """A real uvicorn server on 127.0.0.1:0 with our context and the watcher as a lifespan task."""
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        log_config=None,
        access_log=False,
        lifespan="off",
        **uvicorn_tls_kwargs(tls),
    )
    server = uvicorn.Server(config)
    server_task = asyncio.create_task(server.serve())
    watcher = asyncio.create_task(watch_certificates(tls))
    try:
        deadline = time.monotonic() + 5
        while not server.started:
            assert not server_task.done(), server_task.exception()
            assert time.monotonic() < deadline, "uvicorn did not start"
            await asyncio.sleep(0.01)
        assert config.ssl is tls.context
        port = server.servers[0].sockets[0].getsockname()[1]
        yield port
    finally:
        watcher.cancel()
        server.should_exit = True
        await server_task
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


def tiny_app() -> FastAPI:
    app = FastAPI()

    @app.get("/hello")
    async def hello() -> dict[str, str]:
        return {"hello": "tls"}

    return app


async def wait_for_certificate(port: int, expected: bytes, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while await peer_certificate(port) != expected:
        assert time.monotonic() < deadline, "the server did not switch to the new certificate"
        await asyncio.sleep(0.05)


async def test_https_serves_and_rotates(tmp_path: Path) -> None:
    first, second = make_cert(tmp_path / "c1", serial=1001), make_cert(tmp_path / "c2", serial=2002)
    volume = SecretVolume(tmp_path / "secret")
    volume.publish_pair(first)
    tls = CertificateReloader(str(volume.cert), str(volume.key), interval=0.1)
    assert tls.context.minimum_version == ssl.TLSVersion.TLSv1_2
    async with serve_https(tiny_app(), tls) as port:
        url = f"https://127.0.0.1:{port}/hello"
        async with httpx.AsyncClient(verify=trusting(first)) as old_client:
            assert (await old_client.get(url)).json() == {"hello": "tls"}
            assert await peer_certificate(port) == der(first)

            volume.publish_pair(second)
            await wait_for_certificate(port, der(second))
            assert tls.reloads == 1

            # The connection opened before the rotation keeps working (keep-alive, old certificate).
            assert (await old_client.get(url)).status_code == 200
        # New connections: trusting the new certificate works, trusting only the old one does not.
        async with httpx.AsyncClient(verify=trusting(second)) as new_client:
            assert (await new_client.get(url)).json() == {"hello": "tls"}
        async with httpx.AsyncClient(verify=trusting(first)) as stale_client:
            with pytest.raises(httpx.ConnectError):
                await stale_client.get(url)


async def test_bad_new_pair_is_logged_and_old_one_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = make_cert(tmp_path / "c1", serial=1), make_cert(tmp_path / "c2", serial=2)
    volume = SecretVolume(tmp_path / "secret")
    volume.publish_pair(first)
    tls = CertificateReloader(str(volume.cert), str(volume.key), interval=0.05)
    async with serve_https(tiny_app(), tls) as port:
        caplog.set_level(logging.WARNING, logger="app.serving.tls")
        # Half-rotated: new certificate, old key.
        volume.publish(second.cert.read_bytes(), first.key.read_bytes())
        deadline = time.monotonic() + 5
        while tls.failures == 0:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # several more polls: the same bad pair is not retried or re-logged
        assert tls.failures == 1
        assert [r for r in caplog.records if "does not match" in r.getMessage()]
        assert await peer_certificate(port) == der(first)
        async with httpx.AsyncClient(verify=trusting(first)) as client:
            assert (await client.get(f"https://127.0.0.1:{port}/hello")).status_code == 200
        # Garbage is rejected the same way.
        volume.publish(b"-----BEGIN CERTIFICATE-----\ngarbage\n-----END CERTIFICATE-----\n", b"junk")
        while tls.failures == 1:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        assert await peer_certificate(port) == der(first)
        # The matching key arrives: now it switches.
        volume.publish_pair(second)
        await wait_for_certificate(port, der(second))


async def test_auth_over_https(tmp_path: Path, kube: object) -> None:
    """The two together, as deployed: bearer auth on an HTTPS listener."""
    pair = make_cert(tmp_path / "c", serial=7)
    tls = CertificateReloader(str(pair.cert), str(pair.key))
    app = protected_app(KubeReviewer(kube))  # type: ignore[arg-type]
    async with serve_https(app, tls) as port, httpx.AsyncClient(verify=trusting(pair)) as client:
        base = f"https://localhost:{port}"
        assert (await client.get(f"{base}/metrics")).status_code == 401
        assert (await client.get(f"{base}/metrics", headers=bearer(PROM_TOKEN))).status_code == 200
        assert (await client.get(f"{base}/healthz")).status_code == 200


def test_touch_without_change_is_not_a_reload(tmp_path: Path) -> None:
    pair = make_cert(tmp_path / "c", serial=3)
    tls = CertificateReloader(str(pair.cert), str(pair.key))
    os.utime(pair.cert)
    assert tls.reload_if_changed() is False
    assert tls.reloads == 0


# ---------------------------------------------------------------------------------------------- at start


def _settings(cert: Path, key: Path) -> Settings:
    return Settings(tls_cert_file=str(cert), tls_key_file=str(key))


def test_no_tls_configured() -> None:
    assert load_tls(Settings()) is None
    assert uvicorn_tls_kwargs(None) == {}


def test_missing_certificate_names_the_setting(tmp_path: Path) -> None:
    pair = make_cert(tmp_path / "c", serial=1)
    with pytest.raises(TLSConfigError) as err:
        load_tls(_settings(tmp_path / "nope.crt", pair.key))
    assert str(err.value).startswith(
        "invalid setting tls_cert_file (TRAINER_METRICS_TLS_CERT_FILE): cannot read"
    )
    assert "\n" not in str(err.value)


def test_missing_key_names_the_setting(tmp_path: Path) -> None:
    pair = make_cert(tmp_path / "c", serial=1)
    with pytest.raises(
        TLSConfigError, match=r"^invalid setting tls_key_file \(TRAINER_METRICS_TLS_KEY_FILE\)"
    ):
        load_tls(_settings(pair.cert, tmp_path / "nope.key"))


def test_garbage_certificate_names_the_setting(tmp_path: Path) -> None:
    pair = make_cert(tmp_path / "c", serial=1)
    bad = tmp_path / "bad.crt"
    bad.write_text("this is not a certificate\n")
    with pytest.raises(
        TLSConfigError, match=r"^invalid setting tls_cert_file .*holds no valid PEM certificate"
    ):
        load_tls(_settings(bad, pair.key))


def test_garbage_key_names_the_setting(tmp_path: Path) -> None:
    pair = make_cert(tmp_path / "c", serial=1)
    bad = tmp_path / "bad.key"
    bad.write_text("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    with pytest.raises(TLSConfigError, match=r"^invalid setting tls_key_file .*no usable PEM private key"):
        load_tls(_settings(pair.cert, bad))


def test_mismatched_key_names_the_setting(tmp_path: Path) -> None:
    one, two = make_cert(tmp_path / "c1", serial=1), make_cert(tmp_path / "c2", serial=2)
    with pytest.raises(
        TLSConfigError, match=r"^invalid setting tls_key_file .*does not match the certificate"
    ):
        load_tls(_settings(one.cert, two.key))


def test_encrypted_key_fails_instead_of_prompting(tmp_path: Path) -> None:
    pair = make_cert(tmp_path / "c", serial=1)
    encrypted = tmp_path / "enc.key"
    assert OPENSSL is not None
    subprocess.run(
        [OPENSSL, "pkey", "-in", str(pair.key), "-out", str(encrypted), "-aes256", "-passout", "pass:secret"],
        check=True,
        capture_output=True,
        stdin=subprocess.DEVNULL,
    )
    with pytest.raises(
        TLSConfigError, match=r"^invalid setting tls_key_file .*encrypted keys are not supported"
    ):
        load_tls(_settings(pair.cert, encrypted))


def test_server_context_refuses_old_protocols() -> None:
    ctx = new_server_context()
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert ctx.verify_mode == ssl.CERT_NONE  # no client certificates asked for


async def test_watching_context_reloads_and_stops(tmp_path: Path) -> None:
    first, second = make_cert(tmp_path / "c1", serial=11), make_cert(tmp_path / "c2", serial=22)
    volume = SecretVolume(tmp_path / "secret")
    volume.publish_pair(first)
    tls = CertificateReloader(str(volume.cert), str(volume.key), interval=0.02)
    async with tls.watching():
        volume.publish_pair(second)
        deadline = time.monotonic() + 5
        while tls.reloads == 0:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "tls-certificate-watcher"]


async def test_vanished_files_are_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pair = make_cert(tmp_path / "c", serial=5)
    tls = CertificateReloader(str(pair.cert), str(pair.key))
    pair.cert.unlink()
    caplog.set_level(logging.WARNING, logger="app.serving.tls")
    for _ in range(3):
        assert await tls.check() is False
    assert tls.failures == 3
    assert len([r for r in caplog.records if "cannot read" in r.getMessage()]) == 1
