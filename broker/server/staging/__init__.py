"""Staged publishing: publishes held until a commit makes them visible.

``_area`` (``StagingArea``), ``_records`` (its state journal records),
``_commit`` (routing a committed batch, and finishing at start-up the
commits a stop cut off), ``_in_flight`` (a commit being routed),
``_registry`` (cluster mode: the committed batches in a KV bucket).
"""
