"""What the process can afford in connections: the file limit, raised, and the caps kept below it.

Every connection holds a file descriptor from accept() to close(). Containers commonly start with a soft
limit of 1,024 and a far higher hard limit, so the limit is raised at start-up, and the caps are kept
below it with room for the process's other files, so that accept() does not fail for lack of descriptors
(app/serving/listeners.py copes when it does anyway). A limit too low for any client at all stops
start-up with ``ServerStartError``.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

from app.config import Settings
from app.serving.guard import MAX_CLOSING

# The name these lines had before the server was split into modules: log filters key on it.
log = logging.getLogger("app.serving.server")

# File descriptors kept free for everything but client connections: API-server connections of the
# informers and the elector, log and certificate files, the embedded simulated cluster in --simulate
# (PROCESS_FDS), plus the displaced connections still closing.
PROCESS_FDS = 96
FD_RESERVE = PROCESS_FDS + 2 * MAX_CLOSING
# The probe listener: the kubelet opens about two connections per probe period, without keep-alive.
PROBE_MAX_CONNECTIONS = 32
PROBE_MAX_PER_CLIENT = 16


class ServerStartError(Exception):
    """A listener cannot be set up; the message names the setting, in one line."""


def raise_file_limit(target: int = 1 << 20) -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (at most ``target``); return the soft limit in force.

    Containers commonly start with a soft limit of 1,024 and a far higher hard limit; an unprivileged
    process may raise its soft limit up to the hard one.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = target if hard == resource.RLIM_INFINITY else min(hard, target)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, wanted, exc)
    return target if soft == resource.RLIM_INFINITY else soft


@dataclass(frozen=True, slots=True)
class Limits:
    """The effective connection caps, after the file limit."""

    file_limit: int
    max_connections: int
    max_per_client: int
    probe_max_connections: int

    @classmethod
    def compute(cls, settings: Settings, file_limit: int) -> Limits:
        probe = PROBE_MAX_CONNECTIONS if settings.probe_port is not None else 0
        room = file_limit - FD_RESERVE - probe
        if room < 16:
            raise ServerStartError(
                f"the open-file limit ({file_limit}) leaves no room for client connections: at least "
                f"{FD_RESERVE + probe + 16} is needed (raise `ulimit -n`)"
            )
        main = min(settings.max_connections, room)
        return cls(file_limit, main, min(settings.max_connections_per_client, main), probe)
