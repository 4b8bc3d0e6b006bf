"""The guarantee protocol of one logical channel (sans-IO).

``_receiver`` (``ChannelReceiver``), ``_sender`` (``ChannelSender``),
``_bounds`` (the checks both share).
"""
