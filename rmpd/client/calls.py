"""Calls on an embedded node: the program's calls to groups it need not be in, and the calls a group hands the
program to answer.

A node's counterpart of the daemon's :class:`rmpd.daemon.calls.CallWaiters`: the calls waiting for an answer are
this part's alone, so the node only hands it the engine's two call events and the program's ``call``.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from rmpd.protocol.calls import CALL_ERRORS, CALL_GRACE, DEFAULT_CALL_TIMEOUT
from rmpd.protocol.events import CallAnswered, CallToAnswer
from rmpd.protocol.process import NotMember
from rmpd.protocol.qos import QoS
from rmpd.runtime.loop import ProcessLoop
from rmpd.told import call_failure

from .errors import RmpdError, check_group_name_here, refused
from .events import CallRequest
from .group import Group, GroupInbox


class NodeCalls:
    """The program's calls, by call ID until the group answers or the call times out, and the calls to answer that
    reach the program's joined groups."""

    def __init__(self, require: Callable[[], ProcessLoop], groups: dict[str, tuple[Group, GroupInbox]]) -> None:
        self._require = require
        """The node's running loop (raises when it is not running, or has stopped)."""
        self._groups = groups
        """The node's joined groups (the node adds and removes them)."""
        self._waiting: dict[int, tuple[trio.Event, list[CallAnswered]]] = {}

    async def call(self, group: str, payload: bytes, *, handler: int | None = 0,
                   timeout: float = DEFAULT_CALL_TIMEOUT,
                   qos: QoS = QoS.TOTAL) -> bytes | None:
        """Call ``group`` without joining it (see :meth:`rmpd.client.Client.call`)."""
        check_group_name_here(group)
        loop = self._require()
        done, answer = trio.Event(), list[CallAnswered]()
        with refused(), loop.one_step():  # the answer can come at once (our own one-member group)
            call_id = loop.call(group, bytes(payload), handler=handler, timeout=timeout, qos=qos)
            self._waiting[call_id] = (done, answer)
        try:
            with trio.move_on_after(timeout + CALL_GRACE):
                await done.wait()
        finally:
            if self._waiting.pop(call_id, None) is not None and not answer:
                loop.cancel_call(call_id)
        if not answer:
            raise RmpdError("call-timeout", CALL_ERRORS["timeout"])
        failure = call_failure(answer[0])
        if failure is not None:
            raise RmpdError(*failure)
        return answer[0].reply

    def answered(self, event: CallAnswered) -> None:
        """The group answered one of the program's calls (or the call failed)."""
        entry = self._waiting.get(event.call_id)
        if entry is not None:
            entry[1].append(event)
            entry[0].set()

    def requested(self, event: CallToAnswer) -> None:
        """A non-member's call to a group the program is in: for the program to answer."""
        joined = self._groups.get(event.group)
        if joined is not None:
            joined[1].call(CallRequest(event.payload, event.caller, event.conn, event.stamp, event.handler,
                                       event.group, str(event.view), self._reply))

    async def _reply(self, request: CallRequest, payload: bytes) -> None:
        await trio.lowlevel.checkpoint()
        try:
            with refused():
                ok = self._require().reply(request.group, request.caller, request.conn, request.stamp, payload)
        except NotMember as exc:
            raise RmpdError("not-member", str(exc)) from None
        if not ok:
            raise RmpdError("stale-call", "that call is not waiting for a reply from this node")
