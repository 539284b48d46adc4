"""What the protocol can carry: the checks every entry point applies before anything changes.

The engine runs them on its inputs (``send_batch``, ``lock``, ``unlock``, ``reply``; the process on ``call``), so
the daemon and the embedded node refuse the same arguments with the same message, and nothing is accepted that
would fail later, when it is encoded for the wire: that would surface in a timer or a receive loop, long after the
caller was told the message was accepted.
"""

from __future__ import annotations

from collections.abc import Sequence

from .config import EngineConfig
from .fieldkinds import MAX_KEY, well_formed_keys
from .qos import Level, QoS
from .view import HANDLER_LOCKS, LIBRARY_HANDLER, MAX_LOCK


class BadArgument(ValueError):
    """An argument no group could carry (a handler or lock number out of range, a call timeout of zero)."""

    code = "bad-request"


class MessageTooLarge(BadArgument):
    """A send the group cannot carry (over ``max_message``, or unreliable and over one packet), or a call or a
    reply over one packet."""

    code = "message-too-large"


def check_message_size(config: EngineConfig, payload: bytes, qos: QoS) -> None:
    """Raise MessageTooLarge for a message the group cannot carry; callers that batch check each one first."""
    if len(payload) > config.max_message:
        raise MessageTooLarge(f"a message is at most {config.max_message} bytes; this one has {len(payload)}")
    if qos.level == Level.UNRELIABLE and len(payload) > config.max_packet:
        raise MessageTooLarge(f"an unreliable message must fit one packet ({config.max_packet} bytes)")


class BadKey(BadArgument):
    """A key no group could keep: on a message below total order, empty or too long, or not one per message."""

    code = "bad-key"


def check_keys(payloads: Sequence[bytes], qos: QoS, keys: Sequence[bytes] | None) -> None:
    """``keys`` (or None) for ``payloads``: one per message, each one the group can keep (:func:`check_keyed`)."""
    if keys is None:
        return
    check_keyed(qos, keys)
    if len(keys) != len(payloads):
        raise BadKey(f"one key per message: {len(keys)} keys for {len(payloads)} messages")


def check_keyed(qos: QoS, keys: Sequence[bytes]) -> None:
    """Keys are for total order and above: only there does every member see the same order, so only there can
    every member make the same exactly-once decision.  Each is bytes, 1 to MAX_KEY of them.  The one statement of
    the rule: the engine, the daemon (through the engine) and the client library (before a round trip) apply it."""
    if qos.level < Level.TOTAL:
        raise BadKey(f"a key needs total order or above; this message is {qos.name()}")
    if not well_formed_keys(keys):
        for key in keys:  # name the first key refused
            if type(key) is not bytes:
                raise BadKey(f"a key is bytes, not {type(key).__name__}")
            if not 0 < len(key) <= MAX_KEY:
                raise BadKey(f"a key is 1 to {MAX_KEY} bytes; this one has {len(key)}")


def keyed_qos(qos: QoS) -> QoS:
    """The QoS a keyed message is delivered with: at least MAJORITY.  A sender that sees its own keyed message
    delivered stops resending it; a totally ordered message delivered at its sender may still be lost with the
    sender's view if the sender is cut off before another member holds it, so the key would never be delivered by
    the members that go on.  Delivered once a majority of the view holds it, it survives in every view that keeps
    a majority (``min_partition`` majority), as Kafka's idempotent producer requires acknowledgement by all
    in-sync replicas."""
    return qos if qos.level >= Level.MAJORITY else QoS(Level.MAJORITY)


def check_handler(handler: int | None) -> None:
    """A message's handler: a handler lock, or the client library's own (LIBRARY_HANDLER)."""
    if handler is not None and not 0 <= handler <= LIBRARY_HANDLER:
        raise BadArgument(f"handler must be 0..{HANDLER_LOCKS - 1}, got {handler}")


def check_call_handler(handler: int | None) -> None:
    """A call's handler names the lock whose holder answers: a handler lock only."""
    if handler is not None and not 0 <= handler < HANDLER_LOCKS:
        raise BadArgument(f"handler must be 0..{HANDLER_LOCKS - 1}, got {handler}")


def check_lock(lock: int) -> None:
    if not 0 <= lock <= MAX_LOCK:
        raise BadArgument(f"lock must be 0..{MAX_LOCK}, got {lock}")


def check_one_packet(config: EngineConfig, payload: bytes, what: str) -> None:
    """Calls and replies travel in one datagram each (they are never split into fragments)."""
    if len(payload) > config.max_packet:
        raise MessageTooLarge(f"{what} must fit one packet ({config.max_packet} bytes); this one has {len(payload)}")


def check_call(config: EngineConfig, payload: bytes, handler: int | None, timeout: float) -> None:
    check_one_packet(config, payload, "a call")
    check_call_handler(handler)
    if not timeout > 0:
        raise BadArgument(f"a call's timeout must be above 0 seconds, got {timeout}")
