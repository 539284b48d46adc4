"""Validation of local API requests: one table of operations and the fields each takes.

Frames come from any local process that can open the socket, so each field is checked for presence and type here,
once, and the handlers in :mod:`rmpd.daemon.hub` only ever see a well-formed :class:`Request`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rmpd.protocol.limits import BadArgument, check_handler, check_lock
from rmpd.protocol.qos import QoS

from . import errors
from .errors import RequestError

MAX_GROUP_NAME = 255
MAX_BATCH = 4096
"""Messages one send_batch request may carry."""
MAX_CALL_TIMEOUT = 3600.0


@dataclass
class Request:
    op: str
    id: Any = None
    group: str = ""
    payload: bytes = b""
    payloads: list[bytes] | None = None
    qos: QoS = QoS.TOTAL
    handler: int | None = None
    lock: int = 0
    ttl: int | None = None
    min_partition: int | None = None
    persist: bool = False
    existing_only: bool = False
    timeout: float = 5.0
    caller: str = ""
    conn: int = 0
    stamp: int = 0


# op -> (required fields, optional fields)
OPS: dict[str, tuple[set[str], set[str]]] = {
    "hello": (set(), set()),
    "status": (set(), set()),
    "join": ({"group"}, {"ttl", "min_partition", "persist", "existing_only"}),
    "leave": ({"group"}, {"persist"}),
    "send": ({"group", "payload"}, {"qos", "handler"}),
    "send_batch": ({"group", "payloads"}, {"qos", "handler"}),
    "members": ({"group"}, set()),
    "lock": ({"group", "lock"}, {"persist"}),
    "unlock": ({"group", "lock"}, {"persist"}),
    "call": ({"group", "payload"}, {"handler", "timeout", "qos"}),
    "reply": ({"group", "caller", "conn", "stamp", "payload"}, set()),
}

FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "group": (str,), "payload": (bytes,), "payloads": (list,), "qos": (str,), "handler": (int, type(None)),
    "lock": (int,), "ttl": (int, type(None)), "min_partition": (int, type(None)), "persist": (bool,),
    "existing_only": (bool,), "timeout": (int, float), "caller": (str,), "conn": (int,), "stamp": (int,),
}


def parse_request(frame: dict[str, Any]) -> Request:
    rid = frame.get("id")
    if rid is not None and (not isinstance(rid, int | str) or isinstance(rid, bool)):
        raise RequestError(errors.BAD_REQUEST, "id must be an integer or a string")
    op = frame.get("op")
    if not isinstance(op, str):
        raise RequestError(errors.BAD_REQUEST, "every request needs an 'op' string")
    if op not in OPS:
        raise RequestError(errors.UNKNOWN_OP, f"unknown op {op[:64]!r}; known: {', '.join(sorted(OPS))}")
    required, optional = OPS[op]
    fields = set(frame) - {"op", "id"}
    missing = required - fields
    if missing:
        raise RequestError(errors.BAD_REQUEST, f"{op} needs {', '.join(sorted(missing))}")
    extra = fields - required - optional
    if extra:
        raise RequestError(errors.BAD_REQUEST, f"{op} does not take {', '.join(sorted(extra))}")
    values: dict[str, Any] = {}
    for name in fields:
        value = frame[name]
        types = FIELD_TYPES[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise RequestError(errors.BAD_REQUEST, f"{name} must be {' or '.join(t.__name__ for t in types)}, "
                                                   f"got {type(value).__name__}")
        values[name] = value
    if "group" in values and not 0 < len(values["group"]) <= MAX_GROUP_NAME:
        raise RequestError(errors.BAD_REQUEST, f"group name must be 1..{MAX_GROUP_NAME} characters")
    if "qos" in values:
        try:
            values["qos"] = QoS.parse(values["qos"])
        except ValueError as exc:
            raise RequestError(errors.BAD_REQUEST, str(exc)) from None
    if "payloads" in values:
        payloads = values["payloads"]
        if not 0 < len(payloads) <= MAX_BATCH or not all(type(p) is bytes for p in payloads):
            raise RequestError(errors.BAD_REQUEST, f"payloads must be a list of 1..{MAX_BATCH} byte strings")
    if values.get("ttl") is not None and not 0 <= values["ttl"] <= 255:
        raise RequestError(errors.BAD_REQUEST, "ttl must be 0..255")
    if values.get("min_partition") is not None and values["min_partition"] < 1:
        raise RequestError(errors.BAD_REQUEST, "min_partition must be at least 1")
    if op == "call" and "handler" not in values:
        values["handler"] = 0  # a call goes to handler 0 unless it names another (or None: no handler)
    if "timeout" in values and not 0 < values["timeout"] <= MAX_CALL_TIMEOUT:
        raise RequestError(errors.BAD_REQUEST, f"timeout must be in (0, {MAX_CALL_TIMEOUT}] seconds")
    try:
        check_handler(values.get("handler"))
        if "lock" in values:
            check_lock(values["lock"])
    except BadArgument as exc:
        raise RequestError(errors.BAD_REQUEST, str(exc)) from None
    for name in ("conn", "stamp"):
        if name in values and values[name] < 0:
            raise RequestError(errors.BAD_REQUEST, f"{name} must be non-negative")
    return Request(op=op, id=rid, **values)
