"""Process-wide tuning for processes that move many messages."""

from __future__ import annotations

import gc


def tune_gc(threshold: int) -> None:
    """Run a young garbage collection every ``threshold`` new container
    objects instead of Python's 700, and leave every object that exists now
    out of all later collections (``gc.freeze``). 0 changes nothing.

    A message through the broker or a client makes a few short-lived objects
    and almost never a reference cycle: at Python's default, collections
    that find nothing cost a tenth to a quarter of the CPU. Cyclic garbage
    is still collected, later: so what is made per connection must leave
    no reference cycle when it closes (see ``tests/server/test_churn.py``),
    or connection churn piles up memory until an old-generation collection.
    ``broker serve`` applies ``gc_threshold``; a high-rate client process may
    call this itself (a library never does).
    """
    if threshold < 0:
        raise ValueError("threshold must be >= 0")
    if threshold:
        gc.collect()
        gc.freeze()
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(threshold, older, oldest)
