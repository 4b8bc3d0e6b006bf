"""Opening a connection: the Hello and Welcome, made and received, and
their effects on the parts (the ``Opening`` part)."""

from __future__ import annotations

from .._events import Event, HelloReceived, WelcomeReceived
from .._owners import Cluster
from .._types import SUBSCRIPTION_BINDS, TOPIC_BINDS
from ..frames._framing import FrameDecoder
from ..frames._messages import Hello, Welcome
from ..guarantees._receiver import ChannelSender
from ._channels import DELIVER_SLACK
from ._flow import Flow
from ._handshake import Handshake
from ._large import LargeMessages
from ._parts import MessageParts
from ._publish_many import ManyPublishing
from ._resume import Sessions
from ._session import BrokerSessionState, ClientSessionState
from ._traffic import Traffic
from ._writer import FrameWriter


class Opening:
    """The Hello and Welcome: what the handshake part settles, applied to
    the frame decoder, the guarantees, sessions and the traffic parts; a
    part of the connection, which references the parts it is given, never
    the connection."""

    def __init__(
        self,
        *,
        max_frame: int,
        handshake: Handshake,
        writer: FrameWriter,
        decoder: FrameDecoder,
        flow: Flow,
        sessions: Sessions,
        traffic: Traffic,
        many: ManyPublishing,
        large: LargeMessages,
        parts: MessageParts,
    ) -> None:
        #: Largest frame body this side accepts (announced in Welcome by a broker).
        self.max_frame = max_frame
        self._handshake = handshake
        self._writer = writer
        self._decoder = decoder
        self._flow = flow
        self._sessions = sessions
        self._traffic = traffic
        self._many = many
        self._large = large
        self._parts = parts

    def hello(
        self,
        client: str,
        *,
        session: bytes | None,
        processed: dict[int, int] | None,
        token: str | None,
        resume: ClientSessionState | None,
        deliver_many: bool,
        metadata: bool,
        encoded_deliveries: bool,
        publish_many: bool,
        keep_unconfirmed: bool,
    ) -> None:
        """Client: queue the Hello (see ``Connection.hello``)."""
        message = self._handshake.hello(
            client,
            session=session,
            processed=processed,
            token=token,
            resume=resume,
            deliver_many=deliver_many,
            metadata=metadata,
            publish_many=publish_many,
            max_message=self._large.max_message,
        )
        self._writer.queue(message)
        self._traffic.many = deliver_many
        self._traffic.keep_unconfirmed = keep_unconfirmed
        self._large.keep_unconfirmed = keep_unconfirmed
        self._decoder.encoded_deliveries = deliver_many and encoded_deliveries

    def welcome(
        self,
        *,
        session: bytes,
        epoch: bytes,
        resumed: bool,
        lease_ms: int | None,
        heartbeat_ms: int | None,
        received: dict[int, int] | None,
        restore: BrokerSessionState | None,
        offsets: bool,
        cluster: Cluster | None,
    ) -> None:
        """Broker: queue the Welcome (see ``Connection.welcome``)."""
        message = self._handshake.welcome(
            session=session,
            epoch=epoch,
            resumed=resumed,
            lease_ms=lease_ms,
            heartbeat_ms=heartbeat_ms,
            received=received,
            restore=restore,
            offsets=offsets,
            cluster=cluster,
            max_frame=self.max_frame,
            max_message=self._large.max_message,
        )
        self._writer.queue(message)
        self._many.allowed = message.publish_many
        self._writer.peer_max_frame = self.max_frame + DELIVER_SLACK
        if message.max_message:
            hello = self._handshake.hello_message
            assert hello is not None
            self._large.peer_max_message = hello.max_message
        if restore is not None:
            self._sessions.restore_broker(restore)
            return
        for channel in (TOPIC_BINDS, SUBSCRIPTION_BINDS):
            self._flow.bind_receivers[channel] = self._flow.new_receiver(channel)

    def on_hello(self, message: Hello, size: int, events: list[Event]) -> None:
        self._handshake.on_hello(message)
        self._traffic.many = message.deliver_many
        self._decoder.max_frame = self.max_frame
        events.append(HelloReceived(message))

    def on_welcome(self, message: Welcome, size: int, events: list[Event]) -> None:
        resume = self._handshake.on_welcome(message)  # (a refused Welcome changes nothing)
        hello = self._handshake.hello_message
        self._many.allowed = message.publish_many and hello is not None and hello.publish_many
        self._writer.peer_max_frame = message.max_frame
        large = self._large
        large.peer_max_message = message.max_message if large.max_message else 0
        if large.peer_max_message:
            self._parts.plain_payload = message.max_frame - 64
        self._decoder.max_frame = max(self.max_frame, message.max_frame + DELIVER_SLACK)
        for channel in (TOPIC_BINDS, SUBSCRIPTION_BINDS):
            self._flow.bind_senders[channel] = ChannelSender(channel)
        resent = 0
        dropped: list[Event] = []
        if resume is not None:
            resent = self._sessions.restore_client(resume, message, dropped)
        events.append(WelcomeReceived(message, resent))
        events += dropped
