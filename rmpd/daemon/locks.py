"""Handler locks the daemon holds for its local clients.

The group grants a lock to the daemon, a member of its view; each lock belongs to the local client that took it
(or to the daemon itself, taken with ``persist``: ``rmp lock``).  Only its owner may release it, and it is released
when that client goes away.  One request per lock and operation is in flight (rmpd.runtime.adapter.LockRequests):
another client asking meanwhile is refused with lock-held.
"""

from __future__ import annotations

from typing import Any

from rmpd import localapi
from rmpd.localapi import Request, RequestError
from rmpd.protocol.events import LockResult, ViewInstalled
from rmpd.protocol.process import NotMember
from rmpd.protocol.view import View
from rmpd.runtime.adapter import LockBusy, LockRequests
from rmpd.told import lock_refusal

from .ports import Outlet, Runtime

PERSISTENT = "persistent"
"""Owner of a lock taken with ``persist`` (``rmp lock``): the daemon keeps it until a persistent unlock."""

Owner = Outlet | str | None
"""A client, PERSISTENT, or None: granted to a client that went away meanwhile (released at once)."""


class LockOwners:
    """The locks this daemon holds per group, whose each is, and the requests on their way."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.requests: LockRequests[tuple[Outlet, Any]] = LockRequests(runtime)  # type: ignore[arg-type]
        self._owners: dict[tuple[str, int], Owner] = {}

    def held(self, group: str) -> list[int]:
        return sorted(lock for (g, lock) in self._owners if g == group)

    def client_of(self, group: str, lock: int | None) -> Outlet | None:
        """The client that holds ``lock`` of ``group`` here (None: nobody, the daemon itself, or a client gone)."""
        owner = self._owners.get((group, lock))  # type: ignore[arg-type]
        return None if owner is None or isinstance(owner, str) else owner

    def lock(self, client: Outlet, request: Request, view: View) -> dict[str, Any] | None:
        """A lock request of ``client`` in the group's ``view``: granted at once when it is its already, else
        answered from :meth:`result`."""
        key = (request.group, request.lock)
        owner: Owner = PERSISTENT if request.persist else client
        if key in self._owners:
            if self._owners[key] is owner:
                return {"granted": True, "lock": request.lock}
            raise RequestError(localapi.LOCK_HELD, f"lock {request.lock} is held by another client of this daemon")
        holder = view.lock_holder(request.lock)
        if holder not in (None, self.runtime.pid):
            raise RequestError(localapi.LOCK_HELD, f"lock {request.lock} is held by {holder}")
        self._request(client, request, owner, "lock")
        return None

    def unlock(self, client: Outlet, request: Request) -> None:
        """An unlock request: only the lock's owner may make it (answered from :meth:`result`)."""
        key = (request.group, request.lock)
        owner: Owner = PERSISTENT if request.persist else client
        if key not in self._owners:
            raise RequestError(localapi.NOT_OWNER,
                               f"this daemon does not hold lock {request.lock} of {request.group!r}")
        if self._owners[key] is not owner:
            raise RequestError(localapi.NOT_OWNER, f"lock {request.lock} belongs to another client of this daemon"
                               + ("" if request.persist else " (use a persistent unlock for `rmp lock` locks)"))
        self._request(client, request, owner, "unlock")

    def _request(self, client: Outlet, request: Request, owner: Owner, op: str) -> None:
        try:
            self.requests.request(request.group, request.lock, op, (client, request.id), owner)
        except LockBusy as exc:
            raise RequestError(localapi.LOCK_HELD, str(exc)) from None

    def result(self, event: LockResult) -> None:
        """The group's answer: the owner recorded (a lock granted to a client gone meanwhile is given back), and
        every waiter answered."""
        key = (event.group, event.lock)
        waiters = self.requests.answered(event)
        if event.op == "lock" and event.granted:
            owner = waiters[0][1] if waiters else None
            if owner is not None and not isinstance(owner, str) and owner.closed:  # type: ignore[attr-defined]
                owner = None
            self._owners[key] = owner  # type: ignore[assignment]
            if owner is None:
                self._release(*key)
        elif event.op == "unlock" and event.granted:
            self._owners.pop(key, None)
        refusal = lock_refusal(event)
        for (client, rid), _owner in waiters:
            if refusal is None:
                client.push(localapi.ok_reply(rid, {"granted": True, "lock": event.lock}))
            else:
                client.push(localapi.error_reply(rid, *refusal))

    def client_gone(self, client: Outlet) -> None:
        """A client went away: its locks are given back."""
        for key, owner in list(self._owners.items()):
            if owner is client:
                self._owners[key] = None
                self._release(*key)

    def view_installed(self, event: ViewInstalled) -> None:
        """A view with this process in it: locks whose client went away while the process could not release them
        (between memberships) are released now."""
        if self.runtime.pid not in event.members:
            return
        for (group, lock), owner in list(self._owners.items()):
            if group == event.group and owner is None:
                self._release(group, lock)

    def ended(self, group: str, reason: str) -> None:
        """The membership of ``group`` ended: locks do not survive it, and requests on their way fail with left."""
        for client, rid in self.requests.ended(group):
            client.push(localapi.error_reply(rid, localapi.LEFT, f"left {group!r}: {reason}"))
        for key in [k for k in self._owners if k[0] == group]:
            del self._owners[key]

    def _release(self, group: str, lock: int) -> None:
        try:
            self.runtime.unlock(group, lock)
        except NotMember:
            self._owners.pop((group, lock), None)


__all__ = ["PERSISTENT", "LockOwners", "Owner"]
