"""One join per group name in flight, shared by both backends (the daemon connection and the embedded node)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from .errors import RmpdError
from .group import Group


class _Joining:
    __slots__ = ("done", "error", "group")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.group: Group | None = None
        self.error: BaseException | None = None


class JoinOnce:
    """One join per group name in flight, for both backends: a task that asks while another's join of the same
    group is on its way gets the same Group once it is in a view (or the same error), not a second Group that no
    event would reach, nor one returned before the group was joined."""

    def __init__(self) -> None:
        self._joining: dict[str, _Joining] = {}

    async def run(self, name: str, join: Callable[[], Awaitable[Group]], state: bool = False) -> Group:
        """The Group ``join`` made (or the one another task's join of ``name`` is making); with ``state``, once it
        asked for the group's state (:class:`State`, its first event)."""
        group = await self._once(name, join)
        if state:
            await group._ask_state()
        return group

    async def _once(self, name: str, join: Callable[[], Awaitable[Group]]) -> Group:
        joining = self._joining.get(name)
        if joining is not None:
            await joining.done.wait()
            if joining.group is None:
                raise joining.error or RmpdError("join-failed", f"the join of {name!r} asked first was cancelled")
            return joining.group
        joining = self._joining[name] = _Joining()
        try:
            joining.group = await join()
            return joining.group
        except RmpdError as exc:
            joining.error = exc
            raise
        finally:
            del self._joining[name]
            joining.done.set()
