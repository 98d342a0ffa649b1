"""The remote tier a setting names: a Redis tier, an object-store tier, or several chained in order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._config import Settings, aws_settings, split_remote_urls

__all__ = ["open_remote"]


def open_remote(settings: Settings, *, on_event: Callable[..., None] | None = None, read_only: bool | None = None,
                lease: float | None = None, url: str | None = None) -> Any:
    """The tier (or RemoteChain) for `url` (default: settings.remote) with the settings' secret, TTL, cap, deadline."""
    spec = settings.remote if url is None else url
    options = {
        "secret": settings.remote_secret, "on_event": on_event, "ttl": settings.remote_ttl,
        "max_entry_bytes": settings.remote_max_entry_bytes, "timeout": settings.remote_timeout,
        "read_only": settings.remote_read_only if read_only is None else read_only,
        "lease": settings.remote_lease if lease is None else lease,
    }
    tiers = []
    for part in split_remote_urls(spec):
        if part.startswith("s3://"):
            from ._s3 import S3Tier

            tiers.append(S3Tier(part, aws=aws_settings(), **options))
        else:
            from ._remote import RedisTier

            tiers.append(RedisTier(part, **options))
    if len(tiers) == 1:
        return tiers[0]
    from ._chain import RemoteChain

    return RemoteChain(tiers)
