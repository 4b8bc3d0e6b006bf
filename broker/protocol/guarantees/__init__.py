"""The guarantee protocol of one logical channel (sans-IO).

``_receiver`` (``ChannelReceiver``), ``_sender`` (``ChannelSender``),
``_bounds`` (the checks both share).
"""

from ._receiver import (
    ChannelReceiver,
    ChannelSender,
    ReceiverStatistics,
    SenderStatistics,
    SentFrame,
)

__all__ = [
    "ChannelReceiver",
    "ChannelSender",
    "ReceiverStatistics",
    "SenderStatistics",
    "SentFrame",
]
