"""Raw Kubernetes API access: kubernetes-asyncio's config, auth and session plus what it lacks.

kubernetes-asyncio finds the cluster the way kubectl does and keeps bearer tokens fresh (in-cluster token
file re-read every minute through ``Configuration.refresh_api_key_hook``). Its generated APIs, however, have
no default timeout and assume JSON error bodies; a 429 from max-inflight is ``text/plain`` and a proxy may
answer with HTML. So every request here goes through ``ApiClient.call_api(..., _preload_content=False)``
(auth headers and the refresh hook still apply), which returns the raw aiohttp response that we bound and
parse ourselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import email.utils
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import orjson
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import load_kube_config
from kubernetes_asyncio.config.incluster_config import (
    SERVICE_CERT_FILENAME,
    SERVICE_HOST_ENV_NAME,
    SERVICE_TOKEN_FILENAME,
    InClusterConfigLoader,
)

_NO_CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=None, connect=None, sock_read=None, sock_connect=None)
log = logging.getLogger(__name__)

_AUTH_SETTINGS = ["BearerToken"]
# Error messages are for logs and /debug: cap them so an HTML error page does not flood either.
_MAX_MESSAGE_CHARS = 512
_EPOCH = datetime.datetime.min
# A burst of 401s (every informer and the elector at once) must not re-run an exec plugin for each one.
_MIN_CREDENTIAL_RELOAD_INTERVAL = 5.0


class ApiError(Exception):
    """A failed API call. ``status``: the HTTP status, or 0 when no response arrived (connect, timeout).

    ``reason`` is the Status reason (``Expired``, ``Conflict``...) or the HTTP reason phrase / exception name;
    ``retry_after`` comes from the ``Retry-After`` header (or Status ``details.retryAfterSeconds``);
    ``details`` is the Status ``details`` object when the body was a Status.
    """

    def __init__(
        self,
        status: int,
        reason: str,
        message: str,
        retry_after: float | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{status} {reason}: {message}" if message else f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after
        self.details: Mapping[str, Any] = details or {}

    @property
    def is_too_large_resource_version(self) -> bool:
        """504 "Too large resource version": the server's cache is behind the RV we asked for."""
        if self.status != 504:
            return False
        causes = self.details.get("causes")
        if isinstance(causes, list) and any(
            isinstance(c, dict) and c.get("reason") == "ResourceVersionTooLarge" for c in causes
        ):
            return True
        return "too large resource version" in self.message.lower()


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` is delta-seconds or an HTTP-date (RFC 9110 §10.2.3); None when absent or junk."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if math.isnan(seconds) or math.isinf(seconds):
        return None
    return max(0.0, seconds)


def error_from_response(
    status: int, reason_phrase: str | None, headers: Mapping[str, str], body: bytes
) -> ApiError:
    """Build an ApiError from any error response: a Status JSON, text/plain, HTML or nothing at all."""
    retry_after = parse_retry_after(headers.get("Retry-After"))
    reason = reason_phrase or ""
    message = ""
    details: Mapping[str, Any] | None = None
    parsed: Any = None
    stripped = body.lstrip()
    if stripped[:1] == b"{":
        # Never trust Content-Type: proxies mislabel bodies both ways. Only a JSON object can be a Status.
        with contextlib.suppress(orjson.JSONDecodeError):
            parsed = orjson.loads(stripped)
    if isinstance(parsed, dict) and (
        "reason" in parsed or "message" in parsed or parsed.get("kind") == "Status"
    ):
        reason = str(parsed.get("reason") or reason)
        message = str(parsed.get("message") or "")
        raw_details = parsed.get("details")
        if isinstance(raw_details, dict):
            details = raw_details
            ras = raw_details.get("retryAfterSeconds")
            if (
                retry_after is None
                and isinstance(ras, int | float)
                and not isinstance(ras, bool)
                and ras >= 0
            ):
                retry_after = float(ras)
    else:
        message = " ".join(body[: _MAX_MESSAGE_CHARS * 4].decode("utf-8", "replace").split())
    return ApiError(status, reason, message[:_MAX_MESSAGE_CHARS], retry_after, details)


def _connection_error(exc: BaseException) -> ApiError:
    if isinstance(exc, asyncio.TimeoutError):
        return ApiError(0, "Timeout", str(exc) or "request timed out")
    return ApiError(0, type(exc).__name__, str(exc)[:_MAX_MESSAGE_CHARS])


def _expand_user(path: str) -> str:
    return os.path.expanduser(path)  # no I/O unless the path starts with "~" (then one pwd lookup at startup)


class _CredentialReloader:
    """Re-reads credentials after a 401 (rotated service-account token, expired exec-plugin token)."""

    def __init__(self, configuration: Any, incluster: InClusterConfigLoader | None, kube_loader: Any) -> None:
        self._configuration = configuration
        self._incluster = incluster
        self._kube_loader = kube_loader
        self._last_reload = -math.inf

    async def reload(self) -> None:
        now = time.monotonic()
        if now - self._last_reload < _MIN_CREDENTIAL_RELOAD_INTERVAL:
            return
        self._last_reload = now
        try:
            if self._incluster is not None:
                # The refresh hook re-reads the file only once its cached copy is a minute old; make it stale
                # so the next request picks up the rotated token (the hook copies it into the config).
                self._incluster.token_expires_at = _EPOCH
            elif self._kube_loader is not None:
                await self._kube_loader._load_authentication()
                token = getattr(self._kube_loader, "token", None)
                if token:
                    self._configuration.api_key["BearerToken"] = token
        except Exception:  # a broken credential source must not turn a 401 into a crash
            log.warning("reloading Kubernetes credentials after 401 failed", exc_info=True)


class KubeClient:
    """One authenticated aiohttp session to the API server; safe to share between tasks."""

    def __init__(self, api_client: Any, reloader: _CredentialReloader | None = None) -> None:
        self._api = api_client
        self._reloader = reloader

    @property
    def host(self) -> str:
        return str(self._api.configuration.host)

    @classmethod
    async def connect(cls, kubeconfig: str | None = None, context: str | None = None) -> KubeClient:
        """Find access like kubectl: given kubeconfig, else in-cluster, else $KUBECONFIG ~/.kube/config."""
        configuration = Configuration()
        incluster: InClusterConfigLoader | None = None
        kube_loader: Any = None
        if kubeconfig is None and os.environ.get(SERVICE_HOST_ENV_NAME):
            incluster = InClusterConfigLoader(
                token_filename=SERVICE_TOKEN_FILENAME,
                cert_filename=SERVICE_CERT_FILENAME,
                try_refresh_token=True,
            )
            incluster.load_and_set(configuration)
        else:
            # config_file=None lets kubernetes-asyncio apply $KUBECONFIG (a colon-separated list) else
            # ~/.kube/config. persist_config=False: never rewrite the user's kubeconfig.
            kube_loader = await load_kube_config(
                config_file=_expand_user(kubeconfig) if kubeconfig else None,
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
        api_client = ApiClient(configuration=configuration)
        api_client.user_agent = "trainer-metrics"
        return cls(api_client, _CredentialReloader(configuration, incluster, kube_loader))

    async def close(self) -> None:
        await self._api.close()

    async def _send(
        self,
        method: str,
        *,
        path: str,
        query: Mapping[str, str] | None,
        body: Any,
        content_type: str,
        timeout: aiohttp.ClientTimeout,
    ) -> aiohttp.ClientResponse:
        """Issue one request with auth applied; the caller owns (and must release) the response."""
        try:
            resp: aiohttp.ClientResponse = await self._api.call_api(
                path,
                method,
                query_params=dict(query) if query else None,
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=_AUTH_SETTINGS,
                _preload_content=False,
                _request_timeout=timeout,
            )
        except ApiException as exc:  # only raised for unusable request arguments
            raise ApiError(0, "ClientError", str(exc)[:_MAX_MESSAGE_CHARS]) from exc
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise _connection_error(exc) from exc
        # ApiClient keeps the last response it returned, with the body once read: one LIST page (7 MB at
        # 500 pods) held until the next request, for nothing.
        self._api.last_response = None
        return resp

    async def _raise_for_status(self, resp: aiohttp.ClientResponse) -> None:
        if 200 <= resp.status < 300:
            return
        try:
            # Error bodies are small Status objects, but a proxy page could be anything: read a prefix.
            body = await resp.content.read(64 * 1024)
        except (TimeoutError, aiohttp.ClientError, OSError):
            body = b""
        err = error_from_response(resp.status, resp.reason, resp.headers, body)
        if resp.status == 401 and self._reloader is not None:
            await self._reloader.reload()
        raise err

    async def request_json(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float,
    ) -> Any:
        """One request, bounded by ``timeout`` seconds end to end; returns the decoded JSON (None if empty).

        Raises ApiError for non-2xx (any body format), connection errors and timeouts (status 0).
        """
        try:
            async with asyncio.timeout(timeout):
                resp = await self._send(
                    method,
                    path=path,
                    query=query,
                    body=body,
                    content_type=content_type,
                    # Only the asyncio.timeout above bounds the request. A second, aiohttp-level deadline
                    # expiring in the same loop iteration as a caller's asyncio.timeout (a lagging loop)
                    # uncancels twice and swallows the caller's cancellation: a hung Lease renew then
                    # never ends its renew round and the leader keeps exporting past its Lease.
                    timeout=_NO_CLIENT_TIMEOUT,
                )
                try:
                    await self._raise_for_status(resp)
                    data = await resp.read()
                except BaseException:
                    resp.close()  # never hand a half-read connection back to the pool
                    raise
                resp.release()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise _connection_error(exc) from exc
        if not data.strip():
            return None
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise ApiError(resp.status, "InvalidResponse", f"response is not JSON: {exc}") from exc

    @contextlib.asynccontextmanager
    async def stream(
        self, path: str, *, query: Mapping[str, str], timeout: aiohttp.ClientTimeout
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """GET ``path`` and yield the live response (2xx only) for incremental reading.

        Use ``sock_connect``/``sock_read`` (not ``total``) for watches: ``sock_read`` is the inactivity bound.
        Errors before the body (connect, status) raise ApiError; errors while reading the body are the
        caller's (aiohttp.ClientPayloadError, TimeoutError...).
        """
        resp = await self._send(
            "GET", path=path, query=query, body=None, content_type="application/json", timeout=timeout
        )
        try:
            try:
                await self._raise_for_status(resp)
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                raise _connection_error(exc) from exc
            yield resp
        finally:
            if resp.content.at_eof():
                resp.release()  # body fully read (a list page): keep the connection for the next request
            else:
                resp.close()  # an unfinished watch body must never go back to the pool half-read
