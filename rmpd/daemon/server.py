"""The local client server: a Unix stream socket (mode 0660) speaking length-prefixed msgpack frames.

Every connection gets a :class:`Session`; its reader hands each frame to the hub, its writer drains the session's
bounded queue.  Hostile input only ever produces a structured error: a frame that cannot be decoded gets
``bad-frame`` and the connection goes on; a frame whose length cannot be trusted (too large, truncated) gets its
error and then the connection is closed, because nothing after it can be framed.
"""

from __future__ import annotations

import errno
import grp
import logging
import os
import socket as stdsocket
import struct
from pathlib import Path

import trio

from rmpd.localapi import FrameError, FrameReader, error_reply

from .hub import Hub
from .session import Session

log = logging.getLogger("rmpd")


class SocketInUse(Exception):
    """Another live daemon already serves this socket path."""


def socket_group_id(name: str | None) -> int | None:
    """The gid that should own the socket: the named group, else ``rmpd`` when it exists, else none."""
    try:
        return grp.getgrnam(name or "rmpd").gr_gid
    except KeyError:
        if name:
            raise ValueError(f"socket_group {name!r} does not exist") from None
        return None


def _give_to_group(path: Path, gid: int | None) -> None:
    if gid is None:
        return
    try:
        os.chown(path, -1, gid)
    except OSError as exc:
        log.warning("cannot give %s to group %d: %s", path, gid, exc.strerror)


async def bind_unix_listener(path: Path, mode: int, *, group: str | None = None,
                             dir_mode: int = 0o750) -> trio.SocketListener:
    """Bind ``path``, replacing a stale socket file left by a dead daemon but never a live one.

    The socket gets ``mode`` and, like a runtime directory this creates (``dir_mode``), the group ``group`` (or
    ``rmpd`` when that group exists), so local clients are exactly the members of that group.
    """
    gid = socket_group_id(group)
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=dir_mode)
        _give_to_group(path.parent, gid)
    if path.exists() or path.is_symlink():
        probe = trio.socket.socket(stdsocket.AF_UNIX, stdsocket.SOCK_STREAM)
        try:
            await probe.connect(str(path))
        except OSError as exc:
            if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK):
                raise
            path.unlink(missing_ok=True)
        else:
            raise SocketInUse(f"another rmpd is serving {path}")
        finally:
            probe.close()
    sock = trio.socket.socket(stdsocket.AF_UNIX, stdsocket.SOCK_STREAM)
    try:
        old_umask = os.umask(0o777 & ~mode)
        try:
            await sock.bind(str(path))
        finally:
            os.umask(old_umask)
        os.chmod(path, mode)
        _give_to_group(path, gid)
        sock.listen(64)
    except BaseException:
        sock.close()
        raise
    return trio.SocketListener(sock)


ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
"""accept() failures that mean "out of descriptors or memory for now": the clients already connected and the
group go on, and accepting is tried again shortly."""
ACCEPT_RETRY = 0.1


async def serve_clients(listener: trio.SocketListener, hub: Hub, *, queue_size: int, max_frame: int,
                        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    async with trio.open_nursery() as nursery:
        task_status.started()
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in ACCEPT_CAPACITY_ERRNOS:
                    raise
                if not hub.stats["accept_deferred"]:
                    log.warning("cannot accept local clients for now (%s); trying again every %g s",
                                os.strerror(exc.errno), ACCEPT_RETRY)
                hub.stats["accept_deferred"] += 1
                await trio.sleep(ACCEPT_RETRY)
                continue
            nursery.start_soon(_serve_one, stream, hub, queue_size, max_frame)


def peer_credentials(stream: trio.SocketStream) -> tuple[int, int, int] | None:
    """(pid, uid, gid) of the process at the other end of a Unix socket (SO_PEERCRED), None where unsupported."""
    if not hasattr(stdsocket, "SO_PEERCRED"):
        return None
    try:
        raw = stream.socket.getsockopt(stdsocket.SOL_SOCKET, stdsocket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


async def _serve_one(stream: trio.SocketStream, hub: Hub, queue_size: int, max_frame: int) -> None:
    session = Session(stream, queue_size)
    session.peer = peer_credentials(stream)
    if session.peer is not None:
        log.info("client %d connected: pid %d uid %d gid %d", session.id, *session.peer)
    hub.add(session)
    try:
        with session.scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_writer_then_close, session, nursery.cancel_scope)
                await _reader(session, hub, max_frame)
    except* (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the client hung up
    except* Exception:
        log.exception("client connection %d failed", session.id)  # costs this client, never the daemon
    finally:
        hub.remove(session)
        session.closed = True
        with trio.CancelScope(shield=True):
            await stream.aclose()


async def _writer_then_close(session: Session, scope: trio.CancelScope) -> None:
    try:
        await session.writer()
    finally:
        scope.cancel()


async def _reader(session: Session, hub: Hub, max_frame: int) -> None:
    reader = FrameReader(session.stream, max_frame)
    while not session.closed:
        try:
            frame = await reader.read()
        except FrameError as exc:
            hub.stats["bad_frames"] += 1
            session.push(error_reply(None, exc.code, exc.message))
            if exc.fatal:
                session.finish()
                break
            continue
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            # The client hung up with frames of ours unread (a reset): gone as at a clean end of stream, or its
            # session would stay attached to its groups, its locks held, with no frame ever ending the writer.
            session.finish()
            break
        if frame is None:
            session.finish()
            break
        hub.handle(session, frame)
    await trio.sleep_forever()  # the writer ends the connection once its queue is sent
