"""What a whole compile reads besides its input: TVM's registered state, and the tuning database in context.

Two parts of the model key (_relax.py) and of the build key (_index.py):

    registered   the difference between TVM's registered state in this process and a clean
                 import of this TVM (_baseline.py): every slot (global functions backed by
                 Python, the operator attributes and lowering rules a compile for its target
                 kinds reads, pipelines by name) whose fingerprint (_state.py) is not what
                 `import tvm` puts there (or, for a slot `import tvm` does not set, what the
                 TVM module that adds it puts there), and every imported TVM module (its callable
                 attributes) whose digest is not its clean one, with that fingerprint. Nothing
                 is judged by whose an object is or where it was registered from: TVM's own
                 function at another place, TVM code bound to a user's value, a function
                 assigned over one of TVM's, a TVM module that registers over another's rule
                 when imported are all differences. '' where there are none, so processes that
                 imported different parts of TVM (a frontend, the script parser) share keys. A
                 difference no fingerprint stands for (UncacheableError) makes that compile skip
                 the whole-compile cache, with a warning naming declare_salt.
    database     the MetaSchedule database in context (`with database:`): a digest of all its
                 records (a superset of those that apply), memoized per (database, record count).

The first key in a process reads the whole state; later keys read again only what changed:
the slots registered into since (enable() wraps TVM's registration points,
_compat.REGISTRATION_POINTS, so registrations from any thread, through any of TVM's helpers,
are seen), the target kinds not read yet, the pipelines, and the modules whose attributes are
not the objects they were (an identity check). enable() marks the state stale, so what was
registered while not enabled is found again. Where a point is missing (another tvm-ffi), the
whole state is read on every key.
"""

from __future__ import annotations

import itertools
import logging
import operator
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

import xxhash

from .. import _compat
from .._errors import UncacheableError
from .._forksafe import renew_after_fork
from .._log import warn_once
from . import _baseline, _imports, _state
from ._install import install_part
from ..codegens._pyfunc import python_callable
from ._identity import DECLARE_HINT

__all__ = ["database_part", "install_hooks", "registered_part", "tvm_parts", "uninstall_hooks"]

logger = logging.getLogger(__name__)

_lock = threading.RLock()
renew_after_fork(globals(), "_lock", threading.RLock)  # the state itself holds in the child


class _Read:
    """This process's state as last read: slots and module digests, and what to read again."""

    def __init__(self) -> None:
        self.fresh = False  # False: read everything at the next key
        self.hooked = False
        self.kinds: set[str] | None = set()  # the target kinds whose lowering rules were read (None: all)
        self.slots: dict[str, str] = {}
        self.inner: dict[str, Any] = {}  # global:<name> -> the Function read there (held)
        self.pipelines: tuple = ()  # the pipeline tables' items as last read (held: compared by identity)
        self.modules: dict[str, str] = {}
        # name -> (module, number of attributes, their values) as last digested
        self.seen: dict[str, tuple[types.ModuleType, int, tuple]] = {}
        # (modules seen, every seen module's values in one tuple, their dicts) for one identity check
        self.flat: tuple[int, tuple, list[dict]] | None = None
        self.module_count = -1
        self.memo: dict[tuple[str, frozenset[str], bool], str] = {}  # the last answers, while nothing changed
        self.differing: list[str] = []  # labels that differed from the clean state at the last key
        self.dirty_globals: set[str] = set()
        self.dirty_attrs: set[tuple[str, str]] = set()
        self.wrapped: list[tuple[Any, str, Any, Any]] = []


_read = _Read()
# A module's digest where it is as its import left it (_imports.py): clean without a comparison.
AS_IMPORTED = "as-imported"
_database_memo: dict[str, Any] = {"held": None, "size": -1, "digest": ""}


def tvm_parts(kinds: frozenset[str], *, relax: bool = True) -> tuple[tuple[str, str], ...]:
    """The key parts of TVM as this process runs it, for a compile for target kinds `kinds`:
    `tvm_install` (what is installed, _install.py) and `registered` (the difference from a
    clean import of it; relax=False: a TIR build, which reads no Relax operator's attribute).
    UncacheableError where the state cannot be keyed."""
    install = install_part(_baseline.directory())
    return ("tvm_install", install), ("registered", registered_part(kinds, install, relax=relax))


def registered_part(kinds: frozenset[str], install: str | None = None, *, relax: bool = True) -> str:
    """The `registered` key part of a compile for target kinds `kinds` (module docstring), against
    the clean state of `install` (None: the installed one)."""
    if install is None:
        install = install_part(_baseline.directory())
    _imports.observe()  # from the first key on, whether or not the switch is on: what imports next is watched
    with _lock:
        kinds = frozenset({*_state.DEFAULT_KINDS, *kinds})
        if not _read.fresh:
            _read_all(kinds)
        elif not _read.hooked:
            # The switch is off: nothing sees registrations, so the slots are read again (a TIR
            # build's without the Relax operators'); modules by identity, as always.
            _read.slots = _state.read_slots(kinds, relax=relax)
            _read.kinds = set(kinds)
            _read_modules()
            _read.memo = {}
        elif _read_changes(kinds) or _read.differing:
            _read.memo = {}
        elif (install, kinds, relax) in _read.memo:
            return _read.memo[(install, kinds, relax)]
        slots, modules = dict(_read.slots), dict(_read.modules)
    if not relax:
        slots = {label: fp for label, fp in slots.items() if not label.startswith(_RELAX_SLOT)}
    part = _difference(kinds, install, slots, modules)
    with _lock:
        if _read.hooked:
            _read.memo[(install, kinds, relax)] = part
    return part


_RELAX_SLOT = f"op:{_state.RELAX_OPS}"


def _difference(kinds: frozenset[str], install: str, slots: dict[str, str], modules: dict[str, str]) -> str:
    needed = [name for name, digest in modules.items() if digest != AS_IMPORTED]
    found = []  # nothing registered and every module as its import left it: the clean state itself
    if slots or needed:
        imported = list(modules)
        clean = _baseline.load(install, needed, imported)
        found = _compare(clean, kinds, slots, modules)
        if found and not all(name in clean.modules for name in imported):
            # A slot added by a module imported since the clean state was taken is TVM's own
            # there: take it again with every module imported here before saying what differs.
            clean = _baseline.load(install, imported, imported)
            found = _compare(clean, kinds, slots, modules)
    with _lock:
        # What differs is read again at every key: a user's function may name a helper redefined since.
        _read.differing = [label for label, _ in found]
    for label, fp in found:
        if fp.startswith("unidentifiable:"):
            what = label.replace(":", " ", 1)
            reason = fp.partition(":")[2]
            warn_once(logger, ("state-unidentified", label), "codegen cache: %s", UncacheableError(
                what, reason, f"{DECLARE_HINT}; compiling without the whole-compile cache (its codegen calls still "
                "go through the cache)"))
            raise UncacheableError(what, reason, "see the warning above")
    if not found:
        return ""
    digest = xxhash.xxh3_128()
    for label, fp in found:
        digest.update(f"{len(label)}:{label}={fp};".encode())
    return digest.hexdigest()


def _compare(clean: _baseline.Baseline, kinds: frozenset[str], slots: dict[str, str],
             modules: dict[str, str]) -> list[tuple[str, str]]:
    wanted = {f"{kind}." for kind in kinds}
    found = []
    for label, fp in sorted(slots.items()):
        if clean.clean(label) != fp and _reads(label, wanted):
            found.append((label, fp))
    for name, digest in sorted(modules.items()):
        if digest != AS_IMPORTED and clean.modules.get(name) != digest:
            found.append((f"module:{name}", digest))
    return found


def _reads(label: str, kinds: set[str]) -> bool:
    """Whether a compile for `kinds` reads the slot `label` (lowering rules: only its kinds')."""
    if not label.startswith("op:"):
        return True
    attr = label.rsplit(":", 1)[1]
    return "." not in attr or attr.startswith(tuple(kinds))


def _read_all(kinds: frozenset[str]) -> None:
    _read.memo = {}
    _read.dirty_globals, _read.dirty_attrs = set(), set()
    _read.slots = _state.read_slots(kinds)
    _read.inner = {}
    _remember([label.split(":", 1)[1] for label in _read.slots if label.startswith("global:")])
    _read.kinds = set(kinds)
    _read.modules, _read.seen, _read.module_count, _read.flat = {}, {}, -1, None
    _read.pipelines = tuple((kind, tuple(table.items())) for kind, table in _compat.named_pipelines())
    _read_modules()
    _read.fresh = True


def _read_changes(kinds: frozenset[str]) -> bool:
    """Read again what may have changed since the last key; whether anything did."""
    changed = False
    new = kinds - _read.kinds if _read.kinds is not None else ()
    if new:
        changed |= _update(_state.read_attrs(frozenset(new), new_kinds_only=True))
        _read.kinds |= new
    again = set(_read.dirty_globals)
    again.update(label.split(":", 1)[1] for label in _read.differing if label.startswith("global:"))
    for label in _read.inner:
        if not _same_global(label):
            again.add(label.split(":", 1)[1])  # removed, or registered again where no wrapper saw it
    if again:
        read = _state.read_globals(sorted(again))
        changed |= _update(read, [f"global:{name}" for name in again])
        _remember(again)
    attrs = set(_read.dirty_attrs)
    attrs.update(tuple(label.split(":")[1:]) for label in _read.differing if label.startswith("op:"))
    for op, attr in attrs:
        label = f"op:{op}:{attr}"
        value = _compat.op_attr(op, attr)
        fp = _state.slot_fingerprint_or_reason(label, value) if value is not None else None
        changed |= _update({} if fp is None else {label: fp}, [label])
    _read.dirty_globals, _read.dirty_attrs = set(), set()
    tables = tuple((kind, tuple(table.items())) for kind, table in _compat.named_pipelines())
    if tables != _read.pipelines:  # compared by the registered objects' identity
        _read.pipelines = tables
        changed |= _update(_state.read_pipelines(), [label for label in _read.slots if label.startswith("pipeline:")])
    for label in _read.differing:
        if label.startswith("module:"):
            name = label.split(":", 1)[1]
            if name in sys.modules:
                changed |= _digest_module(name, sys.modules[name])
    return _read_modules() or changed


def _update(found: dict[str, str], gone: list[str] = ()) -> bool:
    """Put `found` into the slots read, after dropping the labels `gone`; whether any slot changed."""
    before = {label: _read.slots.pop(label, None) for label in gone}
    changed = False
    for label, fp in found.items():
        changed |= _read.slots.get(label, before.get(label)) != fp
        _read.slots[label] = fp
    return changed or any(label not in _read.slots and fp is not None for label, fp in before.items())


def _remember(names) -> None:
    """Hold the Function at each global function of `names` backed by Python, for _same_global."""
    for name in names:
        func = _compat.global_func(name, missing_ok=True)
        if func is None or python_callable(func) is None:
            _read.inner.pop(f"global:{name}", None)
        else:
            _read.inner[f"global:{name}"] = func


def _same_global(label: str) -> bool:
    # A registration makes a new function object in TVM's registry: the one held (alive, so its
    # address is not reused) is still there where the handles are equal.
    func = _compat.global_func(label.split(":", 1)[1], missing_ok=True)
    held = _read.inner.get(label)
    return func is not None and held is not None and func.__chandle__() == held.__chandle__()


def _read_modules() -> bool:
    """Digest the modules imported since, and those whose attributes are not the objects they were;
    whether any digest changed."""
    changed = False
    checked = len(_read.seen)
    if _read.flat is not None and _read.flat[0] == checked:
        # One identity check over every module's attributes at once (in C: the modules' dicts are
        # held); module by module only where it fails.
        dicts = _read.flat[2]
        if sum(map(len, dicts)) != len(_read.flat[1]) or \
                not all(map(operator.is_, _read.flat[1], itertools.chain.from_iterable(map(dict.values, dicts)))):
            changed = _recheck_modules()
    else:
        changed = _recheck_modules()
    if len(sys.modules) != _read.module_count:
        _read.module_count = len(sys.modules)
        new = [(name, module) for name, module in _state.tvm_modules() if name not in _read.seen]
        here, at_start_up = _imports.kept_values()
        kept = [here.get(name) or at_start_up.get(name) for name, _ in new]
        # Where the modules with as many attributes as their import left still hold those objects
        # (the common case), one identity check in C says so; the others module by module.
        same = [k is not None and len(k) == len(vars(m)) for k, (_, m) in zip(kept, new)]
        every = all(map(operator.is_, itertools.chain.from_iterable(k for k, s in zip(kept, same) if s),
                        itertools.chain.from_iterable(vars(m).values() for (_, m), s in zip(new, same) if s)))
        for (name, module), alike in zip(new, same):
            if (alike and every) or _imports.as_imported(name, module):
                # As TVM's import left it: clean by construction, no digest, no helper process.
                attributes = vars(module)
                _read.seen[name] = (module, len(attributes), tuple(attributes.values()))
                _read.modules[name] = AS_IMPORTED
            else:
                changed |= _digest_module(name, module)
    if _read.flat is None or _read.flat[0] != len(_read.seen):
        _read.flat = (len(_read.seen), tuple(itertools.chain.from_iterable(v for _, _, v in _read.seen.values())),
                      [vars(module) for module, _, _ in _read.seen.values()])
    return changed


def _recheck_modules() -> bool:
    changed = False
    for name, (module, size, values) in list(_read.seen.items()):
        attributes = vars(module)
        if len(attributes) != size or not all(map(operator.is_, attributes.values(), values)):
            changed |= _digest_module(name, module)
    _read.flat = None
    return changed


def _digest_module(name: str, module: types.ModuleType) -> bool:
    attributes = vars(module)
    _read.seen[name] = (module, len(attributes), tuple(attributes.values()))
    digest = _state.module_digest(name, module)
    changed = _read.modules.get(name) != digest
    _read.modules[name] = digest
    return changed


# ---- the registration points ------------------------------------------------------------------


def _warm_up() -> None:
    try:
        tvm_parts(frozenset())
    except (UncacheableError, OSError, ValueError, RuntimeError) as err:  # the first key meets it again, and says so
        logger.debug("codegen cache: reading TVM's state ahead of the first key: %s", err)


def install_hooks(*, as_imported: bool = False) -> None:
    """Wrap TVM's registration points (enable()); the state is stale: what was registered meanwhile is found.

    as_imported: the registries hold just what `import tvm` put there (the switch turns on as that
    import completes, and the start-up hook saw nothing register before it): the clean state by
    construction, so nothing is read until something registers.
    """
    with _lock:
        _read.fresh = False
        if _read.wrapped:
            return
        hooked = True
        for module, attribute in _compat.REGISTRATION_POINTS:
            original = getattr(module, attribute, None) if module is not None else None
            if not callable(original):
                hooked = False  # the fallback: the whole state is read on every key
                continue
            wrapper = _wrapper(attribute, original)
            _state.own(wrapper, original)
            setattr(module, attribute, wrapper)
            _read.wrapped.append((module, attribute, original, wrapper))
        _read.hooked = hooked
        _imports.observe()
        if hooked and as_imported:
            _read.memo, _read.slots, _read.inner, _read.differing = {}, {}, {}, []
            _read.kinds = None  # every kind: a later registration of any is seen by the wrappers
            _read.dirty_globals, _read.dirty_attrs = set(), set()
            _read.modules, _read.seen, _read.module_count, _read.flat = {}, {}, -1, None
            _read.pipelines = tuple((kind, tuple(table.items())) for kind, table in _compat.named_pipelines())
            _read.fresh = True
            # What the first key would read first (the install's files, the modules as imported, the
            # clean state's file) is read now, while the script builds its model: Python and file
            # reads only, no call into TVM, and nothing a later key does not check again.
            threading.Thread(target=_warm_up, name="codegen-cache-warm-up", daemon=True).start()


def uninstall_hooks() -> None:
    """Undo install_hooks (disable()); a point someone wrapped over ours keeps their wrapper, ours forwarding."""
    with _lock:
        for module, attribute, original, wrapper in _read.wrapped:
            if getattr(module, attribute, None) is wrapper:
                setattr(module, attribute, original)
        _read.wrapped = []
        _read.hooked = False
        _read.fresh = False


def _wrapper(attribute: str, original: Callable[..., Any]) -> Callable[..., Any]:
    if attribute == "_register_global_func":
        def register_global_func(name, func, override, *args):
            try:
                return original(name, func, override, *args)
            finally:
                with _lock:
                    _read.dirty_globals.add(str(name))

        return register_global_func

    if attribute == "RegisterOpLowerIntrinsic":
        def register_lowering(op, func, kind, *args):
            try:
                return original(op, func, kind, *args)
            finally:
                with _lock:
                    _read.dirty_attrs.add((str(op), f"{kind}.FLowerIntrinsic"))

        return register_lowering

    def register_op_attr(op, key, *args):
        try:
            return original(op, key, *args)
        finally:
            with _lock:
                _read.dirty_attrs.add((op if isinstance(op, str) else getattr(op, "name", str(op)), str(key)))

    register_op_attr.__name__ = attribute
    return register_op_attr


# ---- the tuning database ------------------------------------------------------------------------


def database_part() -> str:
    """The `database` key part: '' with no database in context, else a digest of its records."""
    database = _compat.current_database()
    if database is None:
        return ""
    size = len(database)
    with _lock:
        memo = _database_memo  # Database.current() gives a new wrapper per call: compared by handle
        if memo["held"] is not None and memo["held"].same_as(database) and memo["size"] == size:
            return memo["digest"]
    digest = xxhash.xxh3_128()
    digest.update(f"{type(database).__module__}.{type(database).__qualname__}".encode())
    for record in database.get_all_tuning_records():
        digest.update(_compat.save_json(record.as_json()).encode())
        digest.update(_compat.save_json(record.workload.mod).encode())
    found = digest.hexdigest()
    with _lock:
        _database_memo.update(held=database, size=size, digest=found)  # held: its id is not reused meanwhile
    return found
