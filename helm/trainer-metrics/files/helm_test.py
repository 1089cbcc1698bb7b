"""`helm test`: what the chart's test Pod runs (templates/tests/endpoints.yaml), with the exporter image's own
Python and the standard library alone (the image has no shell and no curl).

It asks the Service as Prometheus would: over HTTPS with the CA and server name of the ServiceMonitor's TLS
check when TLS is on, and with the token the ServiceMonitor presents when auth is on. Every input comes from
the environment, which the template sets:

    TM_URL               http(s)://<service>.<namespace>.svc:<port>
    TM_SERVER_NAME       TLS: the name the certificate must carry (default: the URL's host)
    TM_CA_FILE           TLS: PEM bundle to verify it with (absent file: the system's trust store)
    TM_INSECURE          TLS: "true" to skip the verification (serviceMonitor.tlsConfig.insecureSkipVerify)
    TM_AUTH              "true" when the exporter requires a bearer token on /metrics
    TM_TOKEN_FILE        the scrape token (absent: auth is only checked to refuse an anonymous scrape)
    TM_EXPECT            text every replica's /metrics holds
    TM_READY_TIMEOUT     seconds to wait for /readyz 200 (the informers' first sync)

Exit 0 when /readyz answers 200 and /metrics 200 with TM_EXPECT (and 401 without a token when auth is on);
else 1, with what was wrong on stderr.
"""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import sys
import time
from urllib.parse import urlsplit


class _Https(http.client.HTTPSConnection):
    """HTTPS to one host, verifying the certificate for another name (the ServiceMonitor's serverName)."""

    def __init__(
        self, host: str, port: int, *, tls: ssl.SSLContext, server_name: str, timeout: float
    ) -> None:
        super().__init__(host, port, timeout=timeout, context=tls)
        self._tls = tls
        self._server_name = server_name

    def connect(self) -> None:
        self.sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._tls.wrap_socket(self.sock, server_hostname=self._server_name)


class Target:
    def __init__(self, env: dict[str, str]) -> None:
        url = urlsplit(env["TM_URL"])
        if url.scheme not in ("http", "https") or not url.hostname:
            raise SystemExit(f"TM_URL is not an http(s) URL: {env['TM_URL']!r}")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.tls: ssl.SSLContext | None = None
        self.server_name = env.get("TM_SERVER_NAME") or self.host
        if url.scheme == "https":
            ca = env.get("TM_CA_FILE", "")
            self.tls = ssl.create_default_context(cafile=ca if ca and os.path.exists(ca) else None)
            if env.get("TM_INSECURE") == "true":
                self.tls.check_hostname = False
                self.tls.verify_mode = ssl.CERT_NONE
        self.url = env["TM_URL"].rstrip("/")

    def get(self, path: str, token: str | None = None) -> tuple[int, str]:
        conn: http.client.HTTPConnection
        if self.tls is not None:
            conn = _Https(self.host, self.port, tls=self.tls, server_name=self.server_name, timeout=10)
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read().decode("utf-8", "replace")
        finally:
            conn.close()


def _wait_ready(target: Target, timeout: float) -> str | None:
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        try:
            status, body = target.get("/readyz")
            if status == 200:
                return None
            last = f"{status}: {body.strip()[:500]}"
        except ssl.SSLCertVerificationError as exc:
            return f"/readyz: the certificate does not verify: {exc}"  # waiting will not change it
        except (OSError, http.client.HTTPException) as exc:
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() >= deadline:
            return f"/readyz did not answer 200 within {timeout:g} s (last: {last})"
        time.sleep(2)


def run(env: dict[str, str]) -> list[str]:
    """The problems found; empty when every check passed. Prints what passed."""
    target = Target(env)
    problem = _wait_ready(target, float(env.get("TM_READY_TIMEOUT") or 120))
    if problem:
        return [problem]
    print(f"ok: {target.url}/readyz 200")
    problems = []
    expect = env.get("TM_EXPECT") or "trainer_metrics_build_info"
    token_file = env.get("TM_TOKEN_FILE", "")
    token = None
    if token_file and os.path.exists(token_file):
        with open(token_file, encoding="utf-8") as f:
            token = f.read().strip()
    auth = env.get("TM_AUTH") == "true"
    if not auth or token:
        status, body = target.get("/metrics", token)
        how = "with the scrape token" if token else "without a token"
        if status != 200:
            problems.append(f"/metrics {how}: {status}: {body.strip()[:500]}")
        elif expect not in body:
            problems.append(f"/metrics {how}: 200 but no {expect!r} in {len(body)} bytes")
        else:
            print(f"ok: {target.url}/metrics 200 {how} ({len(body)} bytes, {expect} present)")
    if auth:
        status, _ = target.get("/metrics")
        if status != 401:
            problems.append(f"/metrics without a token: {status}, expected 401 (auth is on)")
        else:
            print(f"ok: {target.url}/metrics 401 without a token")
    return problems


def main() -> int:
    try:
        problems = run(dict(os.environ))
    except (OSError, http.client.HTTPException) as exc:
        problems = [f"{type(exc).__name__}: {exc}"]
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
