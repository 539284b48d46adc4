"""The local client server: a Unix stream socket (mode 0660) speaking length-prefixed msgpack frames.

Every connection gets a :class:`Session`; its reader hands each frame to the hub, its writer drains the session's
bounded queue.  Hostile input only ever produces a structured error: a frame that cannot be decoded gets
``bad-frame`` and the connection goes on; a frame whose length cannot be trusted (too large, truncated) gets its
error and then the connection is closed, because nothing after it can be framed.
"""

from __future__ import annotations

import errno
import logging
import os
import socket as stdsocket
from pathlib import Path

import trio

from .frames import FrameError, FrameReader
from .hub import Hub
from .session import Session

log = logging.getLogger("rmpd")


class SocketInUse(Exception):
    """Another live daemon already serves this socket path."""


async def bind_unix_listener(path: Path, mode: int) -> trio.SocketListener:
    """Bind ``path``, replacing a stale socket file left by a dead daemon but never a live one."""
    path.parent.mkdir(parents=True, exist_ok=True)
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
        sock.listen(64)
    except BaseException:
        sock.close()
        raise
    return trio.SocketListener(sock)


async def serve_clients(listener: trio.SocketListener, hub: Hub, *, queue_size: int, max_frame: int,
                        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    async with trio.open_nursery() as nursery:
        task_status.started()
        while True:
            stream = await listener.accept()
            nursery.start_soon(_serve_one, stream, hub, queue_size, max_frame)


async def _serve_one(stream: trio.SocketStream, hub: Hub, queue_size: int, max_frame: int) -> None:
    session = Session(stream, queue_size)
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
            session.push({"id": None, "error": exc.code, "message": exc.message})
            if exc.fatal:
                session.finish()
                break
            continue
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            break
        if frame is None:
            session.finish()
            break
        hub.handle(session, frame)
    await trio.sleep_forever()  # the writer ends the connection once its queue is sent
