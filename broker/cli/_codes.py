"""Constants of the command line that its entry point needs before any
command (and trio with it) is imported."""

from __future__ import annotations

#: ``--log-level`` values (any case is accepted).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
#: Exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130
