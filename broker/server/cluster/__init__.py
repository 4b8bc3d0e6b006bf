"""A broker that is one worker of several: placement and forwarding.

``_placement`` (``WorkerSetup``: membership and sockets), ``_forward``,
``_forward_dropping``, ``_forward_group`` (stand-ins for topics another
worker owns), ``_link`` (a worker's link to an owner: one client
connection), ``_link_runner`` (connecting and running links),
``_link_table`` (the links by owner), ``_origin_dedup`` (forwarded
publishes never stored twice), ``_handover`` (a resume passed to its
session's home), ``_rehome`` (cursors and sessions follow their homes),
``_connection_counts`` (per-principal connection counts across workers),
``_members`` (sans-IO: the live cluster front ends, from their heartbeats),
``_members_io`` (its trio driver over core NATS) and ``_front_ends`` (a
front end's placement among them: owners, link addresses, link token).
"""
