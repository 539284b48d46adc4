"""What the simulated applications do: the senders' messages, and a non-member's calls with the member answering them.

Send times, QoS picks, payloads and call times come from the run's workload generator.  The checker is told every
message handed to a process (what it will have to see delivered), and the calls are checked here: each runs at
most once and is answered once, with the reply its handler made.  With keys (``--keys``) every totally ordered
message carries one, and the applications send again what was not settled (resends.py).
"""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..protocol.events import CallAnswered, CallToAnswer
from ..protocol.limits import MessageTooLarge, keyed_qos
from ..protocol.process import NotMember
from ..protocol.qos import Level, QoS
from ..protocol.status import GroupStatus
from . import QOS_CHOICES
from .checker import InvariantChecker, SentMessage
from .cluster import Cluster
from .config import GROUP, SimConfig
from .resends import KeyedMessage, KeyedSends
from .schedule import AppCall, AppResend, AppSend, Timeline

MIXED = tuple(QoS.parse(name) for name in QOS_CHOICES[:-1])
CALLS_START = 2.5
"""When calls begin: every member's SCMP floor (about 2 s after it started, multirpc.start_upper) has passed."""

Membership = tuple[str, float]
"""One membership of the simulated group: the process ID and the ``now`` it began (``GroupStatus.started_at``).
A process that rejoins after a partition stopped it keeps its ID but begins a new membership."""


@dataclass
class Sent:
    """A message an application handed to its process, and the membership that took it: only messages of a
    membership still running at the end are owed to the survivors."""

    src: str
    seq: int
    membership: Membership
    at: float
    key: bytes | None = None


class Workload:
    """The applications of every slot: who still has messages to send, what was sent, and how the calls went."""

    def __init__(self, config: SimConfig, cluster: Cluster, clock: Timeline, rng: random.Random,
                 checker: InvariantChecker, *, send_interval: float, call_window: float, caller: int | None,
                 drain: Callable[[int], None]) -> None:
        """``caller``: the slot of the non-member that calls the group, if any; ``call_window``: the seconds its
        calls spread over."""
        self.config, self.cluster, self.clock, self.rng, self.checker = config, cluster, clock, rng, checker
        self.send_interval, self.call_window, self.caller, self.drain = send_interval, call_window, caller, drain
        size = len(cluster.pids)
        self.to_send = [config.messages if i < config.senders and i != caller else 0 for i in range(size)]
        self.sent: list[Sent] = []
        """Reliable messages handed to processes, one entry per message (packed ones share their packet's seq)."""
        self.refused = 0
        """Messages the process refused as too large for their QoS."""
        self.calls_run: Counter[bytes] = Counter()
        """Runs per call, by its payload (each call's is unique): a call sent again under a fresh stamp (after a
        probe) is still one call."""
        self.call_answers: Counter[int] = Counter()
        self.calls_replied = 0
        self.calls_failed: Counter[str] = Counter()
        self.keyed = KeyedSends(size, clock) if config.keys else None
        """The keyed messages not yet settled, with ``--keys``."""

    def handlers(self) -> dict[type, Callable[[Any], None]]:
        return {AppSend: self.send, AppCall: self.call, AppResend: self.resend}

    def start(self, i: int) -> None:
        """Schedule the first message of slot ``i``'s application, if it sends any."""
        if self.to_send[i]:
            self.clock.push(self.rng.expovariate(1 / self.send_interval), AppSend(i))

    def stop_sending(self, i: int) -> None:
        self.to_send[i] = 0
        if self.keyed is not None:
            self.keyed.stopped(i)

    def process_lost(self, i: int) -> None:
        """Slot ``i``'s process crashed: its application sends again the keyed messages it carried."""
        if self.keyed is not None:
            self.keyed.process_lost(i)

    def told(self, i: int, events: list[Any]) -> None:
        """What slot ``i``'s process told its application about its keyed messages."""
        proc = self.cluster.procs[i]
        if self.keyed is not None and proc is not None:
            self.keyed.take(i, proc.pid, events)

    def _taking(self, i: int) -> GroupStatus | None:
        """The membership of slot ``i``'s process, when it can take a message now."""
        proc = self.cluster.procs[i]
        status = proc.status(GROUP) if proc is not None else None
        if status is not None and not status.departed and not status.leaving and not status.reforming:
            return status
        return None

    def send(self, event: AppSend) -> None:
        """The application of the slot sends one message (if its process can take it) and schedules the next."""
        cfg, rng, i = self.config, self.rng, event.slot
        qos = rng.choice(MIXED) if cfg.qos == "mixed" else QoS.parse(cfg.qos)
        payload = rng.randbytes(cfg.size)
        status = self._taking(i)
        if status is not None:
            if self.keyed is not None and qos.level >= Level.TOTAL:
                self._send_one(i, status, qos, payload, KeyedMessage(i, self.keyed.new_key(i), payload, qos))
            else:
                self._send_one(i, status, qos, payload)
        self.to_send[i] -= 1
        if self.to_send[i] > 0:
            self.clock.push(self.clock.now + rng.expovariate(1 / self.send_interval), event)

    def resend(self, event: AppResend) -> None:
        """The application of the slot sends again its keyed messages not settled, once its process is in a view."""
        keyed, i = self.keyed, event.slot
        assert keyed is not None
        messages = keyed.due(i)
        for n, message in enumerate(messages):
            if message.key not in keyed.unsettled:
                continue  # settled by what the process said after an earlier resend
            status = self._taking(i)  # sending may change it: each send is told what came of the one before
            if status is None:
                keyed.retry(i, messages[n:])
                return
            self._send_one(i, status, message.qos, message.payload, message, again=True)

    def _send_one(self, i: int, status: GroupStatus, qos: QoS, payload: bytes, keyed: KeyedMessage | None = None,
                  again: bool = False) -> None:
        """Hand one message (``keyed``: under its key) to process ``i`` (whose membership ``status`` describes) and
        tell the checker what it will have to deliver."""
        proc = self.cluster.procs[i]
        assert proc is not None
        first = status.next_seq
        key = keyed.key if keyed is not None else None
        try:
            seq = proc.send(GROUP, payload, qos, self.clock.now, key=key)
        except MessageTooLarge:  # unreliable messages must fit one packet: --size says more
            self.refused += 1
            return
        assert seq is not None
        if key is not None:
            qos = keyed_qos(qos)  # the QoS the group delivers it with
        if qos.level != Level.UNRELIABLE and seq > first:
            # Fragmented: the pieces before the last deliver nothing; unordered ones travel source ordered.
            qos = QoS(Level.SOURCE) if qos.level == Level.UNORDERED else qos
            for piece in range(first, seq):
                self.checker.on_send(SentMessage(proc.pid, piece, qos, ()))
        self.checker.on_send(SentMessage(proc.pid, seq, qos, payload, (key,) if key is not None else ()))
        if qos.level != Level.UNRELIABLE:
            self.sent.append(Sent(proc.pid, seq, (proc.pid, status.started_at), self.clock.now, key))
        if keyed is not None and self.keyed is not None:
            self.keyed.sent(keyed, seq, again)
        self.drain(i)

    # --------------------------------------------------------------------------------------------------------------
    # Calls

    def start_calls(self) -> None:
        """Start the caller; the first member takes handler lock 0 at once; the calls spread over the call window."""
        if self.caller is None:
            return
        self.cluster.spawn(self.caller)
        holder = self.cluster.procs[0]
        assert holder is not None
        holder.lock(GROUP, 0, self.clock.now)
        self.drain(0)
        for n in range(self.config.calls):
            self.clock.push(CALLS_START + self.rng.uniform(0.0, max(self.call_window, 1.0)), AppCall(n))

    def call(self, event: AppCall) -> None:
        proc = self.cluster.procs[self.caller] if self.caller is not None else None
        if proc is None or self.caller is None:
            return
        proc.call(GROUP, f"call {event.number}".encode(), self.clock.now, handler=0, timeout=20.0)
        self.drain(self.caller)

    @property
    def has_calls(self) -> bool:
        return self.caller is not None

    def serve_calls(self, i: int, events: list[Any]) -> None:
        """Serve calls (the handler's holder answers at once) and check each ran at most once, answered once."""
        proc = self.cluster.procs[i]
        assert proc is not None
        checker = self.checker
        for event in events:
            if isinstance(event, CallToAnswer):
                key = event.payload
                self.calls_run[key] += 1
                if self.calls_run[key] > 1:
                    checker.fail("call-at-most-once", f"{key} ran {self.calls_run[key]} times, the last at {proc.pid}")
                with contextlib.suppress(NotMember):
                    proc.reply(GROUP, event.caller, event.conn, event.stamp, event.payload.upper(), self.clock.now)
            elif isinstance(event, CallAnswered):
                self.call_answers[event.call_id] += 1
                if self.call_answers[event.call_id] > 1:
                    checker.fail("call-one-answer", f"call {event.call_id} answered twice")
                if event.error is None:
                    self.calls_replied += 1
                    if not event.reply or not event.reply.startswith(b"CALL "):
                        checker.fail("call-reply", f"call {event.call_id} got reply {event.reply!r}")
                else:
                    self.calls_failed[event.error] += 1
