"""One client connection: its I/O driver and the parts it owns.

``_connection`` (``ServerConnection``: reader, writer and keepalive tasks
around a sans-IO ``broker.protocol.Connection``), ``_admission`` (Hello,
credentials, limits, session), ``_dispatch`` (a read's events to their
parts), ``_publishing`` (publish channels: buffer, forward, confirm),
``_delivery`` (what subscriptions send through), ``_budget`` and
``_budget_pool`` (receive buffers per connection and broker-wide),
``_policy`` (guarantee capacities from budgets), ``_answers`` (control
frames charged until written), ``_reassembly`` (messages in parts).
Nothing here imports ``broker.server.cluster``: what a connection needs of
forwarding it names as a small protocol.
"""
