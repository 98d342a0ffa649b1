"""What CodegenCache.__init__ sets and its mixins (`_promotion`, `_maintenance`, `_by_digest`) use, declared once."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._config import Settings
    from .._storage._disk import ArtifactStore
    from .._storage._memory import ModuleLRU
    from .._storage._pending import PendingFiles
    from ._guard import StorageGuard
    from ._push import Pusher
    from ._stats import StatsRecorder
    from ._tiers import TierChain

__all__ = ["CacheState"]


class CacheState:
    """The attributes of a CodegenCache that its mixins read (annotations only: CodegenCache sets them)."""

    directory: Path
    settings: Settings
    write_behind: bool
    trusted: bool  # CodegenCache's property
    _stores: dict[str, ArtifactStore]
    _staged: dict[str, PendingFiles]
    _staged_index: PendingFiles
    _guard: StorageGuard
    _memory: ModuleLRU
    _chain: TierChain
    _stats: StatsRecorder
    _remote: Any
    _pusher: Pusher | None
    _upgrades_asked: set[str]
