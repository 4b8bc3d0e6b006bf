"""One worker process of a multi-worker broker: a full broker on the sockets
its supervisor made, owning its share of the topics.

It ends gracefully on SIGTERM or SIGINT (the supervisor passes signals on),
and by itself if the supervisor dies (so no orphan keeps the sockets): it
watches the read end of a pipe whose write end only the supervisor holds,
which reads as closed the moment the supervisor is gone, however it ended.
(The kernel's parent-death signal would not do: it follows the *thread*
that started the process, and the supervisor starts workers from threads
that come and go.)
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
from functools import partial

import trio

from broker.runtime import SHUTDOWN_SIGNALS, raise_open_file_limit, run_unwrapped, tune_gc

from ._spec import SPEC_VARIABLE, WorkerSpec

log = logging.getLogger("broker.workers")


async def _supervisor_gone(life_fd: int) -> None:
    """Return once the supervisor is gone (its end of the life pipe closed)."""
    os.set_blocking(life_fd, False)
    while True:
        await trio.lowlevel.wait_readable(life_fd)
        try:
            if not os.read(life_fd, 64):
                return
        except BlockingIOError:
            continue


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
    with trio.open_signal_receiver(*SHUTDOWN_SIGNALS) as signals:
        async with trio.open_nursery() as nursery:

            async def end_with_supervisor() -> None:
                await _supervisor_gone(spec.life_fd)
                log.warning("the supervisor is gone: shutting down gracefully")
                os.kill(os.getpid(), signal.SIGTERM)

            nursery.start_soon(end_with_supervisor)
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
    tune_gc(spec.config.gc_threshold)
    raise_open_file_limit()
    try:
        run_unwrapped(_run, spec)
    except (LogError, OSError) as error:
        print(f"broker worker {spec.worker}: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
