"""Several worker processes behind one address: ``broker serve --workers N``.

- :func:`serve_workers` runs a :class:`Supervisor` that makes the listening
  sockets (one ``SO_REUSEPORT`` socket per worker on the public address, a
  direct address, a Unix link socket and a handover socket each), starts
  the worker processes (``python -m broker.workers``), restarts one that
  ends and drains them all on shutdown. Each worker is a full broker owning
  the topics rendezvous hashing over the worker ids gives it
  (:class:`broker.protocol.Cluster`).
- :class:`WorkerInfo`: one worker as the supervisor's endpoint sees it.
- :func:`merge_expositions` and :func:`merge_stat_documents`: the workers'
  ``/metrics`` and ``/stat.json`` as one (pure functions, :mod:`._merge`).
- :func:`serve_merged_metrics`: the supervisor's HTTP endpoint, which reads
  the workers' own endpoints and serves the merge (:mod:`._http`).
"""

from __future__ import annotations

from ._http import serve_merged_metrics
from ._info import WorkerInfo
from ._merge import merge_expositions, merge_stat_documents
from ._supervisor import Supervisor, WorkerFailed, WorkerProcess, serve_workers

__all__ = [
    "Supervisor",
    "WorkerFailed",
    "WorkerInfo",
    "WorkerProcess",
    "merge_expositions",
    "merge_stat_documents",
    "serve_merged_metrics",
    "serve_workers",
]
