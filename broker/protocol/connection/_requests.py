"""Requests and their answers, as a part of a connection: staging (Commit,
Abort, Outcome), offsets (ListOffsets, Offsets) and administration (Admin,
AdminAnswer). :class:`Requests` numbers a client's requests; it references
the handshake (is the connection open) and the output queue."""

from __future__ import annotations

from .._errors import LocalProtocolError, RemoteProtocolError
from .._events import Event
from .._types import Role
from ..frames._messages import (
    Abort,
    Admin,
    AdminAnswer,
    AdminValue,
    Commit,
    ListOffsets,
    Offsets,
    Outcome,
)
from ._handshake import Handshake
from ._writer import FrameWriter


class Requests:
    """Sending and passing on requests and their answers (see the module)."""

    def __init__(self, role: Role, *, handshake: Handshake, writer: FrameWriter) -> None:
        self.role = role
        self._handshake = handshake
        self._writer = writer
        #: Client: the number of the last request sent.
        self._last_request = 0

    def _require_role(self, role: Role, what: str) -> None:
        if self.role is not role:
            raise LocalProtocolError(f"only a {role.name.lower()} can {what}")

    # ---------------------------------------------------------------- staging

    def commit(self, batch: str, members: list[tuple[str, int]]) -> int:
        """See :meth:`Connection.commit` (its public form)."""
        self._require_role(Role.CLIENT, "commit")
        self._handshake.require_open()
        self._last_request += 1
        self._writer.queue(Commit(self._last_request, batch, list(members)))
        return self._last_request

    def abort(self, batch: str) -> int:
        """See :meth:`Connection.abort` (its public form)."""
        self._require_role(Role.CLIENT, "abort")
        self._handshake.require_open()
        self._last_request += 1
        self._writer.queue(Abort(self._last_request, batch))
        return self._last_request

    def outcome(self, request: int, status: int, messages: int, reason: str = "") -> None:
        """See :meth:`Connection.outcome` (its public form)."""
        self._require_role(Role.BROKER, "answer commits")
        self._handshake.require_open()
        self._writer.queue(Outcome(request, int(status), messages, reason))

    # ---------------------------------------------------------------- offsets

    def list_offsets(self, topics: list[str] | None = None) -> int:
        """See :meth:`Connection.list_offsets` (its public form)."""
        self._require_role(Role.CLIENT, "list offsets")
        self._handshake.require_open()
        self._last_request += 1
        self._writer.queue(
            ListOffsets(self._last_request, None if topics is None else list(topics))
        )
        return self._last_request

    def offsets(self, request: int, topics: list[tuple[str, int, int]], reason: str = "") -> None:
        """See :meth:`Connection.offsets` (its public form)."""
        self._require_role(Role.BROKER, "answer offsets")
        self._handshake.require_open()
        self._writer.queue(Offsets(request, topics, reason))

    # ---------------------------------------------------------------- administration

    def admin(self, command: str, arguments: dict[str, AdminValue] | None = None) -> int:
        """See :meth:`Connection.admin` (its public form)."""
        self._require_role(Role.CLIENT, "administer")
        self._handshake.require_open()
        self._last_request += 1
        self._writer.queue(Admin(self._last_request, command, dict(arguments or {})))
        return self._last_request

    def admin_answer(
        self,
        request: int,
        status: int,
        rows: list[dict[str, AdminValue]],
        after: str | None = None,
        reason: str = "",
    ) -> None:
        """See :meth:`Connection.admin_answer` (its public form)."""
        self._require_role(Role.BROKER, "answer admin requests")
        self._handshake.require_open()
        self._writer.queue(AdminAnswer(request, int(status), rows, after, reason))

    def on_request(
        self,
        message: Commit | Abort | Outcome | ListOffsets | Offsets | Admin | AdminAnswer,
        size: int,
        events: list[Event],
    ) -> None:
        """Commit, Abort, ListOffsets and Admin (client to broker), Outcome,
        Offsets and AdminAnswer (broker to client): checked, passed on."""
        sent_by = (
            Role.BROKER if isinstance(message, Outcome | Offsets | AdminAnswer) else Role.CLIENT
        )
        if self.role is sent_by:
            raise RemoteProtocolError(
                f"{type(message).__name__} is sent by the {sent_by.name.lower()}"
            )
        self._handshake.check_open(message)
        events.append(message)
