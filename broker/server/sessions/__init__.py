"""Sessions: what a client holds on the broker across its connections.

``_session`` (``Session``), ``_records`` (sessions in the state journal),
``_restore`` (the sessions a broker recorded, restored at start-up).
"""
