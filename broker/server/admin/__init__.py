"""Topic administration: the ``Admin`` requests and what they list.

``_requests`` (delete, purge, cursors, groups), ``_lists`` (the answers'
rows, paged).
"""
