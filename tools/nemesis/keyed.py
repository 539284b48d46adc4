"""The client of ``scripts/nemesis --exactly-once`` (``python -m tools.nemesis client --exactly-once``): every message
goes with a key of its own (``h<host>-<n>``, also its payload), and is sent again, with the same key and payload,
until this client sees the group confirm it, by its own Delivery or by ``rmpd.AlreadyDelivered``.

Sent again: what an ``Undelivered`` names (by key, its ``ids``), what a refused send was carrying, and, once the
client has reconnected after a lost connection (the daemon killed and started again), every key not confirmed yet.
The group drops the copies of a key it delivered, so each key should be delivered exactly once, however often it
is sent: the run's report checks that from these logs and the daemons' journals."""

from __future__ import annotations

import signal
from collections import deque
from functools import partial
from pathlib import Path
from typing import Any

import trio

from .client import ClientLog, member_of, read_and_send, stop_on_signal

RECONNECT_EVERY = 0.2
"""Seconds between attempts to reach a daemon that is not there (restarting)."""
REJOINING_PAUSE = 0.5
"""Seconds before a send refused with ``not-member`` (the daemon is rejoining) goes again."""


class Keys:
    """One client's keys across connections: those not confirmed yet, and those to send (again) next."""

    def __init__(self, host: int, log: ClientLog) -> None:
        self.host = host
        self.log = log
        self.made = 0
        self.conn = 0
        self.unconfirmed: dict[str, int] = {}
        """Key -> copies sent so far, for every key made and not yet confirmed."""
        self.to_send: deque[str] = deque()
        """Keys to send next, in order: new ones, and those to send again."""
        self.sending = False
        self.down = False
        """The daemon could not be reached at the last attempt (it was killed and has not started again)."""
        self.stop = trio.Event()
        self.settled = trio.Event()
        self.changed = trio.Event()

    def new_key(self) -> None:
        self.made += 1
        key = f"h{self.host}-{self.made}"
        self.unconfirmed[key] = 0
        self.to_send.append(key)
        self._changed()

    def confirm(self, key: str) -> bool:
        """``key`` is done (delivered, or the group had delivered it already); whether it was still waiting."""
        if self.unconfirmed.pop(key, None) is None:
            return False
        self.check_settled()
        return True

    def again(self, keys: list[str]) -> int:
        """``keys`` (an Undelivered's, or all of them after a lost connection) go again, unless confirmed or queued
        already; how many were queued."""
        queued = set(self.to_send)
        again = [k for k in keys if k in self.unconfirmed and k not in queued]
        self.to_send.extend(again)
        self._changed()
        return len(again)

    def send_all_again(self) -> int:
        """Every unconfirmed key is to be sent, the oldest first; how many of them were sent before."""
        self.to_send = deque(sorted(self.unconfirmed, key=_number))
        self._changed()
        return sum(1 for copies in self.unconfirmed.values() if copies)

    def check_settled(self) -> None:
        if self.stop.is_set() and not self.unconfirmed and not self.sending:
            self.settled.set()

    def _changed(self) -> None:
        self.changed.set()
        self.changed = trio.Event()


async def keyed_client_main(host: int, socket_path: Path, group_name: str, rate: float, out: Path,
                            drain: float) -> None:
    """Make a new key at ``rate`` per second until SIGTERM and send every key until it is confirmed, across daemon
    restarts; after SIGTERM, make no new key and go on sending the unconfirmed ones for up to ``drain`` seconds."""
    log = ClientLog(out)
    keys = Keys(host, log)
    log.write(e="start", host=host, rate=rate, exactly_once=True, undelivered_event=True)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def make_keys() -> None:
                interval, due = 1.0 / rate, trio.current_time()
                while not keys.stop.is_set():
                    keys.new_key()
                    due = max(due + interval, trio.current_time())
                    await trio.sleep_until(due)

            nursery.start_soon(stop_on_signal, signals, nursery, keys, drain,
                               lambda: log.write(e="stop", unconfirmed=len(keys.unconfirmed)))
            nursery.start_soon(make_keys)
            while not keys.settled.is_set():
                await _one_connection(keys, socket_path, group_name)
                if not keys.settled.is_set():
                    await trio.sleep(RECONNECT_EVERY)
            nursery.cancel_scope.cancel()
    log.write(e="end", made=keys.made, unconfirmed=len(keys.unconfirmed), first_unconfirmed=list(keys.unconfirmed)[:20])
    log.close()


async def _one_connection(keys: Keys, socket_path: Path, group_name: str) -> None:
    """Connect, wait until the daemon is in a view of the group, attach, send every unconfirmed key again, and go
    on until the connection ends or the drain is over."""
    import rmpd

    log = keys.log
    conn: int | None = None
    try:
        async with rmpd.connect(socket_path) as client:
            keys.conn += 1
            conn = keys.conn
            if keys.down:
                log.write(e="up", conn=conn)
                keys.down = False
            pid = str((await client.status())["pid"])
            while not await member_of(client, group_name, pid):
                if keys.settled.is_set():
                    return
                await trio.sleep(RECONNECT_EVERY)
            group = await client.join(group_name, existing_only=True)
            # Whatever an earlier connection sent and did not see confirmed may or may not have been delivered:
            # all of it goes again, the oldest first (the group drops the copies of keys it delivered).
            again = keys.send_all_again()
            log.write(e="attach", conn=conn, pid=pid, view=group.view, members=group.known_members, again=again)
            await read_and_send(partial(_read, keys, group, conn), partial(_send, keys, group, conn), keys.settled)
    except (rmpd.RmpdError, OSError) as exc:  # ConnectionLost is an RmpdError
        code = str(getattr(exc, "code", type(exc).__name__))
        if conn is None:
            if not keys.down:
                log.write(e="down", error=code)
                keys.down = True
            return
        log.write(e="lost", conn=conn, error=code, message=str(exc)[:200], unconfirmed=len(keys.unconfirmed))


def _number(key: str) -> int:
    return int(key.rsplit("-", 1)[1])


async def _send(keys: Keys, group: Any, conn: int) -> None:
    """Send the keys to send, one at a time, each with its key; a refused one stays first, to go again."""
    import rmpd

    while True:
        while keys.to_send and keys.to_send[0] not in keys.unconfirmed:
            keys.to_send.popleft()  # confirmed while it waited here (an earlier copy got through)
        if not keys.to_send:
            keys.check_settled()
            await keys.changed.wait()
            continue
        key = keys.to_send[0]
        copy = keys.unconfirmed[key] + 1
        keys.sending = True
        try:
            seq = await group.send(key.encode(), qos=rmpd.QoS.TOTAL, key=key.encode())
        except trio.Cancelled:
            keys.log.write(e="unanswered", id=key, conn=conn, copy=copy)
            raise
        except rmpd.ConnectionLost:
            keys.log.write(e="refused", id=key, conn=conn, copy=copy, error="connection-lost")
            raise
        except rmpd.RmpdError as exc:
            keys.log.write(e="refused", id=key, conn=conn, copy=copy, error=exc.code)
            if exc.code in ("left", "not-joined"):
                raise
            await trio.sleep(REJOINING_PAUSE)  # not a member for now (rejoining): it says so at once, every time
            continue
        finally:
            keys.sending = False
        keys.log.write(e="sent", id=key, conn=conn, seq=seq, copy=copy)
        if key in keys.unconfirmed:
            keys.unconfirmed[key] = copy
        if keys.to_send and keys.to_send[0] == key:
            keys.to_send.popleft()
        keys.check_settled()


async def _read(keys: Keys, group: Any, conn: int) -> None:
    """Every delivery (with its key and place in the order), AlreadyDelivered, Undelivered, view change and
    Rejoining event of the group, as it comes."""
    import rmpd

    log = keys.log
    async for batch in group.batches():
        for event in batch:
            if isinstance(event, rmpd.Delivery):
                key = None if event.key is None else event.key.decode(errors="replace")
                log.write(e="d", id=event.payload.decode(errors="replace"), key=key, src=event.source,
                          seq=event.seq, i=event.index, ts=event.timestamp, view=event.view, conn=conn)
                if key is not None:
                    keys.confirm(key)
            elif isinstance(event, rmpd.AlreadyDelivered):
                key = event.key.decode(errors="replace")
                log.write(e="already", key=key, ts=event.timestamp, view=event.view, conn=conn)
                keys.confirm(key)
            elif isinstance(event, rmpd.Undelivered):
                named = [k.decode(errors="replace") for k in event.ids if isinstance(k, bytes)]
                again = keys.again(named)
                log.write(e="undelivered", conn=conn, seqs=[int(s) for s in event.seqs], ids=named, again=again,
                          reason=str(event.reason))
            elif isinstance(event, rmpd.ViewChange):
                log.write(e="view", conn=conn, view=event.view, members=list(event.members))
            elif isinstance(event, rmpd.Rejoining):
                log.write(e="rejoining", conn=conn, reason=str(event.reason))
    log.write(e="group-ended", conn=conn)
