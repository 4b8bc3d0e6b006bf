"""Sessions: what a client holds on the broker across its connections.

``_session`` (``Session``), ``_records`` (sessions in the state journal),
``_restore`` (the sessions a broker recorded, restored at start-up),
``_cluster_records`` (cluster mode: the records kept in a bucket of the
cluster too, so that any front end resumes them), ``_kv_bucket`` (that
bucket in JetStream KV).
"""
