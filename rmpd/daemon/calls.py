"""Calls between local clients and groups: a client's call to a group (as a non-member), and a group's call to
the client holding the handler's lock here."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

from rmpd import localapi
from rmpd.localapi import Request, RequestError
from rmpd.protocol.events import CallAnswered, CallToAnswer
from rmpd.told import call_failure

from .locks import LockOwners
from .ports import Outlet, Runtime

log = logging.getLogger("rmpd")


class CallWaiters:
    """Calls made for local clients, by call ID, until the group answers or the call fails."""

    def __init__(self, runtime: Runtime, locks: LockOwners, stats: MutableMapping[str, int]) -> None:
        self.runtime = runtime
        self.locks = locks
        self.stats = stats
        self._waiting: dict[int, tuple[Outlet, Any]] = {}

    def call(self, client: Outlet, request: Request) -> None:
        """Call a group as a non-member (no join needed); answered from :meth:`answered`."""
        with self.runtime.one_step():  # the answer can come at once (our own one-member group): wait for it first
            call_id = self.runtime.call(request.group, request.payload, handler=request.handler,
                                        timeout=request.timeout, qos=request.qos)
            self._waiting[call_id] = (client, request.id)
        self.stats["calls"] += 1

    def reply(self, request: Request) -> dict[str, Any]:
        """A local client answers a call it got as the handler's holder."""
        if not self.runtime.reply(request.group, request.caller, request.conn, request.stamp, request.payload):
            raise RequestError(localapi.STALE_CALL, "that call is not waiting for a reply from this daemon")
        return {"sent": True}

    def answered(self, event: CallAnswered) -> None:
        waiter = self._waiting.pop(event.call_id, None)
        if waiter is None:
            return
        client, rid = waiter
        failure = call_failure(event)
        if failure is None:
            client.push(localapi.ok_reply(rid, {"reply": event.reply}))
        else:
            self.stats[f"calls_failed_{event.error}"] += 1
            client.push(localapi.error_reply(rid, *failure))

    def requested(self, event: CallToAnswer) -> None:
        """Hand a call to the local client holding its handler lock; without one nobody here can answer."""
        owner = self.locks.client_of(event.group, event.handler)
        if owner is None:
            self.stats["requests_unserved"] += 1
            log.warning("call to %s handler %d with no local client holding the lock", event.group, event.handler)
            return
        owner.push(localapi.call_request_event(event.group, event.caller, event.conn, event.stamp, event.handler,
                                               event.payload, str(event.view)))

    def forget(self, client: Outlet) -> None:
        """A client went away: its calls are cancelled."""
        for call_id, (waiter, _) in list(self._waiting.items()):
            if waiter is client:
                del self._waiting[call_id]
                self.runtime.cancel_call(call_id)


__all__ = ["CallWaiters"]
