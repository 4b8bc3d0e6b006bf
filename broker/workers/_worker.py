"""One worker process of a multi-worker broker: a full broker on the sockets
its supervisor made, owning its share of the topics.

It ends gracefully on SIGTERM or SIGINT (the supervisor passes signals on),
and by itself if the supervisor dies (so no orphan keeps the sockets).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import sys
from functools import partial

import trio

from broker.runtime import raise_open_file_limit, sole_failure, tune_gc

from ._spec import SPEC_VARIABLE, WorkerSpec

log = logging.getLogger("broker.workers")

#: prctl's option: the signal the kernel sends this process when its parent ends.
PR_SET_PDEATHSIG = 1


def _end_with_parent(supervisor: int) -> None:
    """Ask the kernel for SIGTERM when the supervisor ends (Linux), and end
    now if it already has."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != supervisor:
        raise SystemExit(0)


async def _run(spec: WorkerSpec) -> None:
    from broker.metrics import serve_metrics
    from broker.server import WorkerSetup, serve_broker

    setup = WorkerSetup(
        cluster=spec.cluster,
        client_sockets=[socket.socket(fileno=spec.public_fd), socket.socket(fileno=spec.direct_fd)],
        link_socket=socket.socket(fileno=spec.link_fd),
        link_paths=spec.link_paths,
        handover_socket=socket.socket(fileno=spec.handover_fd),
        handover_paths=spec.handover_paths,
        connection_counts=spec.connection_counts,
    )
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            broker = await nursery.start(partial(serve_broker, spec.config, worker=setup))
            metrics = await nursery.start(serve_metrics, broker, "127.0.0.1", 0)
            ready = {"pid": os.getpid(), "metrics": list(metrics)}
            with os.fdopen(spec.ready_fd, "w") as pipe:
                pipe.write(json.dumps(ready) + "\n")
            async for signum in signals:
                log.info("%s: shutting down gracefully", signal.Signals(signum).name)
                break
            await broker.shutdown()
            nursery.cancel_scope.cancel()


def main() -> int:
    """Run the worker the environment describes; the process's exit status."""
    from broker.log import LogError

    text = os.environ.get(SPEC_VARIABLE)
    if not text:
        print(
            "broker worker: no worker description: start workers with `broker serve --workers N`",
            file=sys.stderr,
        )
        return 2
    spec = WorkerSpec.from_json(text)
    logging.basicConfig(
        level=spec.log_level,
        format=f"%(asctime)s %(levelname)s %(name)s [{spec.worker}]: %(message)s",
    )
    _end_with_parent(spec.supervisor)
    tune_gc(spec.config.gc_threshold)
    raise_open_file_limit()
    try:
        try:
            trio.run(_run, spec)
        except BaseExceptionGroup as group:
            failure = sole_failure(group)
            if failure is group:
                raise
            raise failure from None
    except (LogError, OSError) as error:
        print(f"broker worker {spec.worker}: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
