"""The worker processes of ``broker serve --workers N``: what their supervisor
serves for all of them.

- :class:`WorkerInfo`: one worker as the supervisor sees it (:mod:`._info`).
- :func:`merge_expositions` and :func:`merge_stat_documents`: the workers'
  ``/metrics`` and ``/stat.json`` as one (pure functions, :mod:`._merge`).
- :func:`serve_merged_metrics`: the supervisor's HTTP endpoint, which reads
  the workers' own endpoints and serves the merge (:mod:`._http`).
"""

from ._http import serve_merged_metrics
from ._info import WorkerInfo
from ._merge import merge_expositions, merge_stat_documents

__all__ = ["WorkerInfo", "merge_expositions", "merge_stat_documents", "serve_merged_metrics"]
