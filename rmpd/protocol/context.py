"""What every part of one group's engine is handed (``GroupContext``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .config import EngineConfig
from .ids import ProcessId
from .outbox import Outbox
from .views import Views


@dataclass(frozen=True, slots=True)
class GroupContext:
    """What every part of one group's engine is handed: whose membership it is, of which group, its settings, the
    views it knows, where its output goes, and its counters."""

    pid: ProcessId
    group: str
    config: EngineConfig
    views: Views
    outbox: Outbox
    stats: Counter[str]
