"""What goes with an evicted compiled model: the entries of its library.

A model entry (codec MODEL_CODEC, tagged GROUP_TAG in the compiled store) names the entries its
library is made of (`library`: the build key in the index store, the host and device parts by
mode and digest, _build/_relax.py). Served alone, none of them is the model; and a model entry
whose parts are gone is a miss that still takes room. So when eviction removes one, the parts go
in the same pass (an entry another model shares is built again by the next compile that needs it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping

from .._artifacts import unframe
from .._errors import ArtifactError
from .._storage._disk import STORAGE_ERRORS, ArtifactStore
from .._storage._layout import ENTRY_STORES, MODEL_CODEC

__all__ = ["evict_parts", "parts_of"]

logger = logging.getLogger(__name__)


def parts_of(blob: bytes) -> Iterator[tuple[str, str]]:
    """(store, key) of each entry a model entry names; nothing for another entry or a damaged one."""
    try:
        art = unframe(blob)
    except ArtifactError:
        return
    library = art.meta.get("library") if art.codec == MODEL_CODEC else None
    if not isinstance(library, dict):
        return
    if isinstance(library.get("build_key"), str):
        yield "index", library["build_key"]
    devices = library.get("devices")
    for part in (library.get("host"), *(devices if isinstance(devices, list) else ())):
        if isinstance(part, dict) and part.get("mode") in ENTRY_STORES and isinstance(part.get("digest"), str):
            yield part["mode"], part["digest"]


def evict_parts(stores: Mapping[str, ArtifactStore], blob: bytes) -> None:
    """Remove the entries the evicted model entry `blob` names (a storage failure leaves them: logged)."""
    for store, key in parts_of(blob):
        try:
            stores[store].delete(key)
        except (*STORAGE_ERRORS, TimeoutError) as err:
            logger.debug("codegen cache: a part of an evicted model stays in %s/ (%s)", store, err)
