"""One end of a connection (sans-IO): ``Connection`` and its parts.

``_connection``: :class:`Connection` (``receive_data``, the table of the
parts' frame handlers, and the public methods, which delegate to the
parts; ``publish`` and ``deliver_encoded_many`` are its own, on the
parts' state). It subclasses nothing: it owns its parts, each with its
own state, none referencing the connection:

- ``_writer``: the output queue (``FrameWriter``);
- ``_handshake`` (with ``_liveness``): the lifecycle, Hello and Welcome
  made and checked, keepalive (``Handshake``);
- ``_opening``: the Hello and Welcome's effects on the parts (``Opening``);
- ``_flow`` (with ``_channels``): the guarantees of every channel (``Flow``);
- ``_binds`` (with ``_handles``, ``_handle_state``): binding, resolving
  and freeing handles (``Handles``);
- ``_resume`` (with ``_session``): sessions saved and restored (``Sessions``);
- ``_requests``: staging, offsets and admin requests (``Requests``);
- ``_control``: received control messages (``Control``);
- ``_traffic`` (with ``_short_run``, ``_receiving``): publish, deliver and
  their notices (``Traffic``);
- ``_publish_many``: PublishMany frames (``ManyPublishing``);
- ``_large`` (with ``_parts``): messages in parts (``LargeMessages``, on
  the state of ``MessageParts``).

``_core``: the opening's constants and ``ConnectionStatistics``.
"""

from ._connection import DELIVER_SLACK, MAX_HELLO_FRAME, PIECE_OVERHEAD
from ._handles import Binding, HandleState, HandleTable
from ._large import MAX_MESSAGE, MIN_PART
from ._liveness import Liveness
from ._session import BrokerSessionState, ClientSessionState, SubscriptionInfo

__all__ = [
    "DELIVER_SLACK",
    "MAX_HELLO_FRAME",
    "MAX_MESSAGE",
    "MIN_PART",
    "PIECE_OVERHEAD",
    "Binding",
    "BrokerSessionState",
    "ClientSessionState",
    "HandleState",
    "HandleTable",
    "Liveness",
    "SubscriptionInfo",
]
