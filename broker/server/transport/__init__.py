"""Bytes on a trio stream: the writer's wake-up call and fast socket I/O.

``_wake`` (``Wake``, ``Outbox``: output queued by any part of a connection,
written by its reader's task when the writer is idle), ``_socket_io``
(reads and writes on a plain TCP socket without trio's per-call yields),
``_replayed`` (a stream whose first bytes, read already, are read again),
``_linger`` (the last moment of a connection the broker closes).
Shared by client connections and the workers' links.
"""
