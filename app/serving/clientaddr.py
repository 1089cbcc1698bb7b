"""Whom a connection or a request counts against, for the per-client limits (app/serving/guard.py,
app/api/auth/budget.py).

One IPv4 address, or the /64 of an IPv6 address: a single host usually holds a whole /64, so counting
IPv6 addresses one by one would let it multiply its quota by 2^64.
"""

from __future__ import annotations

import ipaddress
from typing import Any


def client_key(address: Any) -> str:
    """The key for a peer address: a (host, port, ...) tuple as sockets and ASGI give it, or a host."""
    host = address[0] if isinstance(address, tuple | list) and address else address
    if host is None:
        return ""
    text = str(host).split("%", 1)[0]  # an IPv6 zone ("fe80::1%eth0") names an interface, not a host
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return text
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)
