"""Data handles: small integers naming topics and subscriptions, per session.

Handles of one type are bound consecutively from 0. Freeing is the
three-step exchange of the seed: a peer proposes with ``FreeHandle`` and
stops using the handle; the other side marks it and answers with its own
``FreeHandle``; each side deletes its binding once no buffered message still
references it. Concurrent proposals from both sides confirm each other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Generic, TypeVar, overload

from .._errors import LocalProtocolError, RemoteProtocolError
from .._types import HandleType
from ..frames._messages import FreeHandle

V = TypeVar("V")


class HandleState(Enum):
    """Where a binding is in the freeing exchange."""

    BOUND = "bound"
    #: This side proposed freeing it; the peer may still reference it.
    PROPOSED = "proposed"
    #: The peer proposed (or confirmed); deleted once no buffered message needs it.
    MARKED = "marked"


@dataclass(slots=True)
class Binding(Generic[V]):
    """What a handle is bound to, and where it is in the freeing exchange.

    A connection's tables hold subclasses that also carry the handle's
    channel and session state (``_handle_state``)."""

    value: V
    state: HandleState = HandleState.BOUND
    #: Buffered messages that still reference this handle.
    references: int = 0
    #: The peer sent its FreeHandle, so it must not reference the handle any more.
    peer_done: bool = False


B = TypeVar("B", bound="Binding[Any]")


class HandleTable(Generic[B]):
    """One side's bindings of one handle type.

    ``created_here`` says whether this side binds the handles (the client
    does, for both types); it fixes the ``mine`` flag of ``FreeHandle``.
    ``make`` builds the binding of a value (default: a plain :class:`Binding`);
    a connection's tables make per-handle state objects.
    """

    __slots__ = ("_bindings", "bindings", "created_here", "handle_type", "make", "next_handle")

    @overload
    def __init__(
        self: HandleTable[Binding[Any]], handle_type: HandleType, *, created_here: bool
    ) -> None: ...

    @overload
    def __init__(
        self, handle_type: HandleType, *, created_here: bool, make: Callable[[Any], B]
    ) -> None: ...

    def __init__(
        self,
        handle_type: HandleType,
        *,
        created_here: bool,
        make: Callable[[Any], Any] = Binding,
    ) -> None:
        self.handle_type = handle_type
        self.created_here = created_here
        self.make: Callable[[Any], B] = make
        #: The least handle not yet bound.
        self.next_handle = 0
        self._bindings: dict[int, B] = {}
        #: Handle -> binding, to read (one lookup on a fast path); it changes
        #: only through this table's methods. Always the same mapping object.
        self.bindings: Mapping[int, B] = self._bindings

    def __len__(self) -> int:
        return len(self._bindings)

    def __contains__(self, handle: int) -> bool:
        return handle in self._bindings

    def items(self) -> list[tuple[int, B]]:
        return list(self._bindings.items())

    def bind(self, value: Any) -> int:
        """Bind the next handle to ``value`` and return it."""
        handle = self.next_handle
        self._bindings[handle] = self.make(value)
        self.next_handle += 1
        return handle

    def restore(self, bindings: Mapping[int, Any], next_handle: int) -> None:
        """Bind exactly ``bindings`` (handle -> value), with ``next_handle`` the
        least never bound: the handles of a resumed session, on a new connection."""
        if self._bindings or self.next_handle:
            raise LocalProtocolError("only an unused handle table can be restored")
        if any(not 0 <= handle < next_handle for handle in bindings):
            raise LocalProtocolError(f"restored handles must lie below {next_handle}")
        make = self.make
        self._bindings.update((h, make(value)) for h, value in sorted(bindings.items()))
        self.next_handle = next_handle

    def get(self, handle: int) -> B | None:
        return self._bindings.get(handle)

    def is_deleted(self, handle: int) -> bool:
        """The handle was bound once and its binding is gone."""
        return handle < self.next_handle and handle not in self._bindings

    def unbind_last(self, count: int) -> list[int]:
        """Undo the last ``count`` binds (their bind frames can never be sent).

        Returns the handles removed. Only this side's own, never-confirmed
        binds may be undone: the peer has not bound them.
        """
        removed = list(range(self.next_handle - count, self.next_handle))
        for handle in removed:
            del self._bindings[handle]
        self.next_handle -= count
        return removed

    # -- references
    def resolve_local(self, handle: int) -> B:
        """The binding this side is about to reference in a message it sends."""
        binding = self._bindings.get(handle)
        if binding is None:
            raise LocalProtocolError(
                f"{self.handle_type.name.lower()} handle {handle} is not bound"
            )
        if binding.state is not HandleState.BOUND:
            raise LocalProtocolError(
                f"{self.handle_type.name.lower()} handle {handle} is being freed"
            )
        return binding

    def resolve_remote(self, handle: int) -> B | None:
        """The binding a received message references.

        Returns None for a handle above every bound one (the caller decides
        whether that is an optimistic reference to discard). Raises
        :class:`RemoteProtocolError` for a deleted handle or one the peer
        itself proposed to free.
        """
        binding = self._bindings.get(handle)
        if binding is None:
            if handle >= self.next_handle:
                return None
            raise RemoteProtocolError(
                f"reference to freed {self.handle_type.name.lower()} handle {handle}"
            )
        if binding.peer_done:
            raise RemoteProtocolError(
                f"reference to {self.handle_type.name.lower()} handle {handle} "
                "after proposing to free it"
            )
        return binding

    def acquire(self, handle: int, count: int = 1) -> None:
        """``count`` more buffered messages now reference ``handle``."""
        self._bindings[handle].references += count

    def references(self, handle: int) -> int:
        """How many buffered messages reference ``handle`` (0 if it is not bound)."""
        binding = self._bindings.get(handle)
        return 0 if binding is None else binding.references

    def release(self, handle: int, count: int = 1) -> bool:
        """``count`` buffered messages referencing ``handle`` are done; True if it got deleted."""
        binding = self._bindings[handle]
        if binding.references < count:
            raise LocalProtocolError(
                f"handle {handle} has {binding.references} references, cannot release {count}"
            )
        binding.references -= count
        return self._delete_if_done(handle, binding)

    def _delete_if_done(self, handle: int, binding: B) -> bool:
        if binding.state is HandleState.MARKED and binding.references == 0:
            del self._bindings[handle]
            return True
        return False

    # -- freeing
    def propose_free(self, handle: int) -> FreeHandle:
        """Start freeing ``handle``; this side must not reference it any more."""
        binding = self.resolve_local(handle)
        binding.state = HandleState.PROPOSED
        return FreeHandle(int(self.handle_type), handle, self.created_here)

    def on_free(self, handle: int, mine: bool) -> tuple[FreeHandle | None, bool]:
        """The peer proposed freeing ``handle``, or confirmed our proposal.

        Returns ``(reply, deleted)``: the FreeHandle to answer a proposal with
        (None for a confirmation) and whether the binding is gone already.
        """
        if mine == self.created_here:
            raise RemoteProtocolError(
                f"FreeHandle mine={mine} but the handle was "
                f"{'created here' if self.created_here else 'created by the peer'}"
            )
        binding = self.resolve_remote(handle)
        if binding is None:
            raise RemoteProtocolError(
                f"FreeHandle for unbound {self.handle_type.name.lower()} handle {handle}"
            )
        if binding.state is HandleState.MARKED:
            raise RemoteProtocolError(f"second FreeHandle for handle {handle}")
        reply = None
        binding.peer_done = True
        if binding.state is HandleState.BOUND:
            reply = FreeHandle(int(self.handle_type), handle, self.created_here)
        binding.state = HandleState.MARKED
        return reply, self._delete_if_done(handle, binding)
