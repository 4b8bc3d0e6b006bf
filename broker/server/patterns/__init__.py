"""Pattern subscriptions: one subscription to every topic a pattern matches.

``_subscription`` (``PatternSubscription`` and its members), ``_outlet``
(the connection its members send through), ``_registry`` (the live
patterns, told of every topic made).
"""
