"""One end of a connection (sans-IO): ``Connection`` and its parts.

``_connection`` (``receive_data`` and the handler table), ``_core``
(state and lookups), the parts it owns: ``_writer`` (the output queue),
``_handshake`` (with ``_liveness``), ``_flow`` (with ``_channels``),
``_parts``, ``_binds`` (with ``_handles``), ``_resume`` (with
``_session``), ``_requests``; and ``_handle_state``, ``_control``,
``_traffic``, ``_publish_many``, ``_large``, ``_short_run``.
"""
