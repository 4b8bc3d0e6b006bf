"""Several worker processes behind one address: ``broker serve --workers N``.

:func:`serve_workers` runs a :class:`Supervisor` that makes the listening
sockets (one ``SO_REUSEPORT`` socket per worker on the public address, a
direct address and a Unix link socket each), starts the worker processes
(``python -m broker.workers``), restarts one that ends and drains them all
on shutdown. Each worker is a full broker owning the topics rendezvous
hashing over the worker ids gives it (:class:`broker.protocol.Cluster`).
"""

from __future__ import annotations

from ._supervisor import Supervisor, WorkerFailed, WorkerProcess, serve_workers

__all__ = ["Supervisor", "WorkerFailed", "WorkerProcess", "serve_workers"]
