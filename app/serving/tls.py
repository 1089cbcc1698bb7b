"""HTTPS from a certificate and key file, reloaded in place when they change.

cert-manager renews certificates by rewriting the Secret; the kubelet swaps the mounted files through a
``..data`` symlink. Restarting the pod for every renewal would cost scrapes and leadership, so instead the
one ``ssl.SSLContext`` uvicorn serves with is kept and ``load_cert_chain`` is called on it again: OpenSSL
copies the context's certificate into each new connection, so new handshakes get the new certificate and
open connections keep theirs.

A new pair is first loaded into a scratch context. Only when that works is it loaded into the live one: a
key that does not match the certificate (caught halfway through a non-atomic update, or simply wrong) would
otherwise leave the live context with the new certificate and no usable key. The exact bytes validated are
the bytes loaded (via an in-memory copy: a memfd, so the private key is never written to a disk), so a
file changing between the two steps cannot slip in.

    tls = load_tls(settings)                     # None without TLS; TLSConfigError names the bad setting
    uvicorn.run(app, ..., **uvicorn_tls_kwargs(tls))
    # in the lifespan: await stack.enter_async_context(tls.watching())
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import ssl
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from app.config import ENV_PREFIX, Settings

log = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL = 5.0
_MAX_PEM_BYTES = 1024 * 1024  # a chain is a few KiB; a huge file is a mistake, not a certificate


class TLSConfigError(Exception):
    """The TLS files cannot be used; the message names the setting and says why, in one line."""


def _setting(name: str) -> str:
    return f"invalid setting {name} ({ENV_PREFIX}{name.upper()})"


@dataclass(frozen=True, slots=True)
class _Pair:
    cert: bytes
    key: bytes

    @property
    def digest(self) -> bytes:
        return hashlib.sha256(len(self.cert).to_bytes(8, "big") + self.cert + self.key).digest()


def _read(path: str, setting: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_PEM_BYTES + 1)
    except OSError as exc:
        raise TLSConfigError(f"{_setting(setting)}: cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > _MAX_PEM_BYTES:
        raise TLSConfigError(f"{_setting(setting)}: {path} is larger than {_MAX_PEM_BYTES} bytes")
    return data


def _read_pair(cert_file: str, key_file: str) -> _Pair:
    return _Pair(_read(cert_file, "tls_cert_file"), _read(key_file, "tls_key_file"))


def new_server_context() -> ssl.SSLContext:
    """A server context: TLS 1.2 or later, Python's default (secure) cipher list, no client certificates."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])  # what uvicorn's HTTP/1.1 protocols speak
    return ctx


def _no_password() -> bytes:
    # Without a callback OpenSSL would prompt on the terminal for an encrypted key and block the process;
    # an empty answer makes it fail at once instead.
    return b""


@contextlib.contextmanager
def _in_memory_file(data: bytes, name: str) -> Iterator[str | None]:
    """A path to ``data`` that never touches a disk (Linux memfd via /proc), or None where unavailable."""
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is None:
        yield None
        return
    try:
        fd = memfd_create(f"trainer-metrics-{name}", getattr(os, "MFD_CLOEXEC", 0))
    except OSError:
        yield None
        return
    try:
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.write(data)
        path = f"/proc/self/fd/{fd}"
        yield path if os.path.exists(path) else None
    finally:
        os.close(fd)


@contextlib.contextmanager
def _pem_paths(pair: _Pair) -> Iterator[tuple[str, str]]:
    """Paths holding exactly ``pair`` (load_cert_chain takes paths only): in memory if possible, else in a
    private temporary directory (0700, files 0600) removed at once."""
    with _in_memory_file(pair.cert, "crt") as cert_path, _in_memory_file(pair.key, "key") as key_path:
        if cert_path is not None and key_path is not None:
            yield cert_path, key_path
            return
    with tempfile.TemporaryDirectory(prefix="trainer-metrics-tls-") as tmp:
        paths = []
        for name, data in (("tls.crt", pair.cert), ("tls.key", pair.key)):
            path = os.path.join(tmp, name)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            paths.append(path)
        yield paths[0], paths[1]


def _load(ctx: ssl.SSLContext, pair: _Pair, cert_file: str, key_file: str) -> None:
    """load_cert_chain from exactly these bytes; TLSConfigError naming the bad file."""
    with _pem_paths(pair) as (cert_path, key_path):
        try:
            ctx.load_cert_chain(cert_path, key_path, password=_no_password)
        except ssl.SSLError as exc:
            raise _classify(exc, pair, cert_file, key_file) from None


def _classify(exc: ssl.SSLError, pair: _Pair, cert_file: str, key_file: str) -> TLSConfigError:
    if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc):
        return TLSConfigError(
            f"{_setting('tls_key_file')}: the private key in {key_file} does not match the certificate "
            f"in {cert_file}"
        )
    # Which file is it? A certificate that parses on its own puts the blame on the key.
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(
            cadata=pair.cert.decode("ascii", "replace")
        )
    except (ssl.SSLError, ValueError):
        return TLSConfigError(f"{_setting('tls_cert_file')}: {cert_file} holds no valid PEM certificate")
    return TLSConfigError(
        f"{_setting('tls_key_file')}: {key_file} holds no usable PEM private key "
        f"(encrypted keys are not supported): {exc.reason or exc}"
    )


class CertificateReloader:
    """The live server ``SSLContext`` plus what is needed to reload it when the files change."""

    def __init__(self, cert_file: str, key_file: str, *, interval: float = DEFAULT_POLL_INTERVAL) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.interval = interval
        pair = _read_pair(cert_file, key_file)
        self.context = new_server_context()
        _load(self.context, pair, cert_file, key_file)  # raises TLSConfigError: fail at start, clearly
        self._good = pair
        self._rejected: bytes | None = None
        self._last_error: str | None = None
        self.reloads = 0
        self.failures = 0

    @classmethod
    def from_settings(
        cls, settings: Settings, *, interval: float = DEFAULT_POLL_INTERVAL
    ) -> CertificateReloader | None:
        if settings.tls_cert_file is None or settings.tls_key_file is None:
            return None
        return cls(settings.tls_cert_file, settings.tls_key_file, interval=interval)

    def _prepare(self) -> _Pair | None:
        """Read the files; the new pair if it differs from the loaded one and loads cleanly, else None.

        Blocking (file reads, PEM parsing): run in a thread.
        """
        pair = _read_pair(self.cert_file, self.key_file)
        digest = pair.digest
        if digest in (self._good.digest, self._rejected):
            return None
        try:
            _load(new_server_context(), pair, self.cert_file, self.key_file)
        except TLSConfigError:
            self._rejected = digest
            raise
        return pair

    def _install(self, pair: _Pair) -> None:
        # On the event loop thread: handshakes are set up there too, so none sees a half-loaded context.
        try:
            _load(self.context, pair, self.cert_file, self.key_file)
        except TLSConfigError:
            # Cannot happen after _prepare succeeded with the same bytes, but if it does, put back the
            # pair that worked rather than serve with a certificate whose key is gone.
            _load(self.context, self._good, self.cert_file, self.key_file)
            raise
        self._good = pair
        self._rejected = None
        self.reloads += 1

    def reload_if_changed(self) -> bool:
        """Synchronous check and reload; True if a new pair was installed. Raises TLSConfigError."""
        pair = self._prepare()
        if pair is None:
            return False
        self._install(pair)
        return True

    async def check(self) -> bool:
        """One poll: True if a new pair was installed; a bad pair is logged (once) and the old one kept."""
        try:
            pair = await asyncio.to_thread(self._prepare)
            if pair is None:
                return False
            self._install(pair)
        except TLSConfigError as exc:
            self.failures += 1
            # A Secret that stays broken (or missing) is logged once per distinct problem, not every poll.
            if str(exc) != self._last_error:
                self._last_error = str(exc)
                log.warning("keeping the current TLS certificate; the new files are not usable: %s", exc)
            return False
        self._last_error = None
        log.info("reloaded the TLS certificate from %s", self.cert_file)
        return True

    async def watch(self) -> None:
        """Poll every ``interval`` seconds until cancelled."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.check()
            except Exception:  # never let the watcher die: the next poll may work
                log.exception("checking the TLS certificate files failed")

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[CertificateReloader]:
        """Run ``watch`` as a task for the duration of the block (e.g. the app's lifespan)."""
        task = asyncio.create_task(self.watch(), name="tls-certificate-watcher")
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def ssl_context_factory(self, config: Any, default: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        """For ``uvicorn.Config(ssl_context_factory=...)``: serve with our live context."""
        return self.context


def load_tls(settings: Settings, *, interval: float = DEFAULT_POLL_INTERVAL) -> CertificateReloader | None:
    """The reloader for ``tls_cert_file``/``tls_key_file``, None when TLS is off. Raises TLSConfigError."""
    return CertificateReloader.from_settings(settings, interval=interval)


def uvicorn_tls_kwargs(tls: CertificateReloader | None) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.run``/``uvicorn.Config``: HTTPS with our live context, or nothing."""
    if tls is None:
        return {}
    return {"ssl_context_factory": tls.ssl_context_factory}


async def watch_certificates(tls: CertificateReloader) -> None:
    """Poll the certificate files until cancelled (a lifespan task); same as ``tls.watch()``."""
    await tls.watch()
