"""Idle and slow-header HTTP clients from many loopback addresses, as a process of its own (so the test
that measures the server is not slowed down by its own attackers).

    python -m tests.serving.attacker --port P --seconds 8 --group idle:1000:2:20 --group slow:800:30:10

A group is ``kind:connections:first_host:hosts``: that many connections from 127.0.0.<first_host> onwards,
spread over ``hosts`` addresses. ``idle`` connections send nothing; ``slow`` ones send a request line and
then one header every 0.3 s, never the blank line that ends the head. Each connection is re-opened 1 to 3 s
after the server drops it. At the end, one JSON line: connections opened and dropped.

The process lowers its own CPU priority: real attackers run on other machines and cannot take the server's
CPU, which on a shared two-core test machine these would.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import sys


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    try:
        data = await asyncio.wait_for(reader.read(1024), seconds)
    except TimeoutError:
        return False
    except OSError:
        return True
    return not data  # EOF (a 4xx before the close reads as data, then EOF on the next read)


class Attack:
    def __init__(self, port: int, stop: asyncio.Event) -> None:
        self.port = port
        self.stop = stop
        self.opened = 0
        self.dropped = 0

    async def connection(self, source: str, slow: bool, rng: random.Random) -> None:
        while not self.stop.is_set():
            writer = None
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port, local_addr=(source, 0))
                self.opened += 1
                if slow:
                    writer.write(b"GET /metrics HTTP/1.1\r\nHost: exporter\r\n")
                while not self.stop.is_set():
                    await writer.drain()
                    if await _closed_within(reader, 0.3):
                        self.dropped += 1
                        break
                    if slow:
                        writer.write(b"X-Slow: 1\r\n")
            except OSError:
                self.dropped += 1
            finally:
                if writer is not None:
                    writer.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), rng.uniform(1.0, 3.0))


async def main(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    attack = Attack(args.port, stop)
    rng = random.Random(1)
    tasks = []
    for group in args.group:
        kind, count, first, hosts = group.split(":")
        for i in range(int(count)):
            source = f"127.0.0.{int(first) + i % int(hosts)}"
            tasks.append(asyncio.create_task(attack.connection(source, kind == "slow", rng)))
    print(json.dumps({"started": len(tasks)}), flush=True)
    await asyncio.sleep(args.seconds)  # the duration of the attack is the point of this process
    stop.set()
    await asyncio.gather(*tasks)
    print(json.dumps({"opened": attack.opened, "dropped": attack.dropped}), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--group", action="append", default=[])
    os.nice(10)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    asyncio.run(main(parser.parse_args(sys.argv[1:])))
