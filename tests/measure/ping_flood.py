"""Measure how much one connection flooding tiny frames slows another client.

Starts ``broker serve``; a prober connection measures Ping round trips
(median, p99, max) alone, then while a flooder process writes Ping frames in
2 MB writes as fast as the broker takes them (and reads the Pongs).

    python tests/measure/ping_flood.py [--seconds 10] [--rounds 2]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import socket
import statistics
import subprocess
import threading
import time
from typing import Any

from _process import free_port, serve_command, wait_listening  # (tests/measure is sys.path[0])

from broker.protocol import PROTOCOL_VERSION, Hello, Ping, Pong, Welcome
from broker.protocol.frames import FrameDecoder, encode

#: Bytes per write of the flooder.
WRITE = 2 * 1000 * 1000


class Raw:
    """A blocking raw-protocol connection."""

    def __init__(self, port: int, name: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = FrameDecoder(max_frame=1 << 20)
        self.sock.sendall(encode(Hello(PROTOCOL_VERSION, name, None, {})))
        self.wait(lambda m: isinstance(m, Welcome))

    def wait(self, predicate: object) -> None:
        while True:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("broker closed the connection")
            self.decoder.feed(data)
            if any(predicate(m) for m, _ in self.decoder.messages()):  # type: ignore[operator]
                return


def flood(port: int, stop: Any, answered: Any) -> None:
    """Write Pings in 2 MB writes until ``stop`` is set, counting the Pongs
    read back in ``answered`` (the Pings the broker handled)."""
    raw = Raw(port, "flooder")
    ping = encode(Ping(1))
    chunk = ping * (WRITE // len(ping))

    def drain() -> None:
        while data := raw.sock.recv(1 << 20):
            answered.value += len(data) // len(encode(Pong(1)))

    threading.Thread(target=drain, daemon=True).start()
    while not stop.is_set():
        raw.sock.sendall(chunk)


def probe(raw: Raw, seconds: float) -> list[float]:
    """Ping round trips (seconds) for ``seconds``, one at a time, 1 ms apart."""
    times = []
    nonce = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        nonce += 1
        start = time.perf_counter()
        raw.sock.sendall(encode(Ping(nonce)))
        raw.wait(lambda m, n=nonce: isinstance(m, Pong) and m.nonce == n)
        times.append(time.perf_counter() - start)
        time.sleep(0.001)
    return times


def summary(times: list[float]) -> str:
    ordered = sorted(times)
    p99 = ordered[int(0.99 * (len(ordered) - 1))]
    return (
        f"n={len(times)} median {statistics.median(times) * 1000:.2f} ms, "
        f"p99 {p99 * 1000:.2f} ms, max {ordered[-1] * 1000:.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], help="a broker setting NAME=VALUE")
    args = parser.parse_args()
    port = free_port()
    broker = subprocess.Popen(serve_command(port, "WARNING", *args.set), start_new_session=True)
    try:
        wait_listening(port)
        prober = Raw(port, "prober")
        for _ in range(args.rounds):
            print("alone:      ", summary(probe(prober, args.seconds)), flush=True)
            stop = multiprocessing.Event()
            answered = multiprocessing.Value("q", 0, lock=False)
            flooder = multiprocessing.Process(target=flood, args=(port, stop, answered))
            flooder.start()
            time.sleep(0.5)
            start, before = time.monotonic(), answered.value
            times = probe(prober, args.seconds)
            rate = (answered.value - before) / (time.monotonic() - start)
            stop.set()
            flooder.terminate()
            flooder.join()
            print(f"with flood: {summary(times)} ({rate / 1e6:.2f}M Ping/s)", flush=True)
    finally:
        os.killpg(broker.pid, signal.SIGTERM)
        broker.wait()


if __name__ == "__main__":
    main()
