"""Code is loaded only from a cache directory no other user can change (git's safe.directory rule).

Real Unix users, made with useradd for this module and removed after it: `mallory` (the
attacker, in no group of the others), `alice` and `bob` (members of a team group). Each runs
as itself, in its own process. The forged entries are real llvm entries whose shared library
has a constructor that leaves a marker file: if it ever runs, the marker says so. Needs root
(as CI runs); skipped with the reason elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

import codegen_cache as cc
from codegen_cache._artifacts import frame, unframe
from test_checked_load import shared_library

TESTS = str(Path(__file__).parent)
SRC = str(Path(cc.__file__).parent.parent)
SUFFIX = f"{os.getpid() % 100000}"

VICTIM = textwrap.dedent("""
    import json, logging, os, sys
    sys.path.insert(0, {tests!r})
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    import numpy as np, tvm
    import codegen_cache as cc, kernels
    mod, target = cc.prepare_for_codegen(kernels.vadd, "llvm")
    cache = cc.CodegenCache({directory!r}, write_behind=False)
    module, outcome = cache.lower_with_outcome(mod, target)
    if {flush!r}:
        assert cache.flush(upgrades=True, timeout=200)
    a = np.arange(1024, dtype="float32")
    out = tvm.runtime.tensor(np.zeros(1024, "float32"))
    right = module.implements_function("vadd")  # a foreign library has no vadd
    if right:
        module["vadd"](tvm.runtime.tensor(a), tvm.runtime.tensor(a), out)
        right = bool((out.numpy() == a + a).all())
    print(json.dumps({{"tier": outcome.tier, "right": right, "trusted": cache.trusted}}), flush=True)
    if os.environ.get("VICTIM_EXIT_AT_ONCE"):
        os._exit(0)  # no exit handlers: its counter file stays, as a live process's is
""")


def _ids(name: str) -> tuple[int, int]:
    import pwd

    entry = pwd.getpwnam(name)
    return entry.pw_uid, entry.pw_gid


@pytest.fixture(scope="module")
def users():
    """{'mallory', 'alice', 'bob', 'team'} -> (uid, gid) / gid; made with useradd, removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create second Unix users with useradd (CI runs as root)")
    if shutil.which("useradd") is None or shutil.which("groupadd") is None:
        pytest.skip("useradd/groupadd are not installed")
    team = f"cgcteam{SUFFIX}"
    names = {role: f"cgc{role[:3]}{SUFFIX}" for role in ("mallory", "alice", "bob")}
    made_group, made = False, []
    try:
        subprocess.run(["groupadd", team], check=True, capture_output=True, timeout=60)
        made_group = True
        for role, name in names.items():
            extra = [] if role == "mallory" else ["-G", team]
            subprocess.run(["useradd", "-M", "-N", "-s", "/usr/sbin/nologin", *extra, name], check=True,
                           capture_output=True, timeout=60)
            made.append(name)
        import grp

        found = {role: _ids(name) for role, name in names.items()}
        found["team"] = grp.getgrnam(team).gr_gid
        found["names"] = names
        yield found
    finally:
        for name in made:
            subprocess.run(["userdel", name], capture_output=True, timeout=60)
        if made_group:
            subprocess.run(["groupdel", team], capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def base(users):
    """A directory under /tmp every test user can reach (pytest's own tmp directories are 0700)."""
    directory = Path(tempfile.mkdtemp(prefix="cgc-trust-", dir="/tmp"))
    directory.chmod(0o755)
    (directory / "markers").mkdir(mode=0o1777)
    (directory / "markers").chmod(0o1777)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def interpreter(users, base):
    """(python, environment) a test user can run: this one, else the system's of the same version."""
    paths = [p for p in sys.path if p.endswith("site-packages")] + [SRC]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": os.pathsep.join(paths), "HOME": str(base),
           "CODEGEN_CACHE_DIR": str(base / "unused-default")}
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for python in (sys.executable, f"/usr/bin/python{version}", shutil.which(f"python{version}")):
        if not python:
            continue
        try:
            done = subprocess.run([python, "-c", "import codegen_cache, tvm"], user=users["alice"][0],
                                  group=users["alice"][1], env=env, cwd=str(base), capture_output=True, timeout=120)
        except PermissionError:
            continue  # in a directory only its owner may enter (/root)
        if done.returncode == 0:
            return python, env
    pytest.skip(f"no Python {version} with this environment is usable by a second user "
                f"({sys.executable} lies in a directory only its owner can enter)")


def run_as(users, interpreter, role: str, directory: Path, *, flush: bool = False, umask: int = 0o022,
           env: dict | None = None) -> tuple[dict, str]:
    """Lower the llvm vector add in `directory` as `role` ('root': this user); (result, log)."""
    python, base_env = interpreter
    script = VICTIM.format(tests=TESTS, directory=str(directory), flush=flush)
    as_user = {} if role == "root" else {"user": users[role][0], "group": users[role][1],
                                         "extra_groups": [] if role == "mallory" else [users["team"]]}
    done = subprocess.run([python, "-c", script], env={**base_env, **(env or {})}, cwd=str(directory.parent),
                          capture_output=True, text=True, timeout=280, umask=umask, **as_user)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def as_user(users, role: str, *command: str) -> None:
    """Run a shell command as `role` (the attacker needs no Python: cp, mv, mkdir, chmod)."""
    done = subprocess.run(["sh", "-c", " ".join(command)], user=users[role][0], group=users[role][1],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def forged(base, llvm_vadd):
    """(store, marker): a valid cache holding the llvm vector add as a library with a constructor."""
    forge = base / "forge"
    forge.mkdir()
    marker = base / "markers" / "forged-constructor-ran"
    library = shared_library(forge, "evil", marker, 2)
    cache = cc.CodegenCache(forge / "cache", write_behind=False)
    mod, target = llvm_vadd
    cache.lower(mod, target)
    assert cache.flush(upgrades=True, timeout=240)
    digest = cache.key_for(mod, target).digest
    art = unframe(cache.store("compiled").get(digest))
    assert art.codec == "llvm-so"
    cache.store("compiled").put(digest, frame("llvm-so", art.meta, [library.read_bytes(), bytes(art.fields[1])]))
    cache.close()
    subprocess.run(["chmod", "-R", "a+rX", str(forge)], check=True, timeout=60)
    return forge / "cache", marker


def _plant(users, forged, where: Path) -> None:
    """mallory copies the forged store to `where`: every file and directory there is hers."""
    as_user(users, "mallory", "cp", "-r", str(forged[0]), str(where))


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_a_forged_store_another_user_planted_at_the_cache_path_is_never_loaded(users, interpreter, base, forged):
    # The attack: in a directory everyone may write into (sticky, as /tmp), mallory
    # puts a forged store where alice's CODEGEN_CACHE_DIR points.
    shared = base / "sticky"
    shared.mkdir(mode=0o1777)
    shared.chmod(0o1777)
    _plant(users, forged, shared / "cache")
    result, log = run_as(users, interpreter, "alice", shared / "cache")
    assert not forged[1].exists(), "mallory's constructor ran as alice"
    assert result == {"tier": "uncached", "right": True, "trusted": False}
    warnings = [line for line in log.splitlines() if "not using" in line]
    assert len(warnings) == 1 and str(shared / "cache") in warnings[0] and users["names"]["mallory"] in warnings[0]
    # The control: trusted explicitly, the same store is used, and the forged library runs.
    result, _log = run_as(users, interpreter, "alice", shared / "cache",
                          env={"CODEGEN_CACHE_TRUSTED_DIRS": str(shared / "cache")})
    assert result == {"tier": "disk", "right": False, "trusted": True} and forged[1].exists()
    forged[1].unlink()


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_a_cache_in_a_directory_anyone_can_write_is_never_used_and_one_renamed_away_cannot_be_replaced(
        users, interpreter, base, forged):
    # Under a world-writable parent without the sticky bit, anyone can rename alice's cache
    # away and put theirs in its place: nothing is loaded from there, not even alice's own.
    world = base / "world"
    world.mkdir(mode=0o777)
    world.chmod(0o777)
    result, log = run_as(users, interpreter, "alice", world / "cache")
    assert result == {"tier": "uncached", "right": True, "trusted": False}
    assert f"{world} (owned by 'root' (uid 0)) is writable by every user" in log
    # In a sticky directory alice's own cache works, and mallory cannot move it away.
    sticky = base / "sticky-own"
    sticky.mkdir(mode=0o1777)
    sticky.chmod(0o1777)
    assert run_as(users, interpreter, "alice", sticky / "cache", flush=True)[0]["tier"] == "codegen"
    assert run_as(users, interpreter, "alice", sticky / "cache")[0] == {"tier": "disk", "right": True,
                                                                        "trusted": True}
    done = subprocess.run(["mv", str(sticky / "cache"), str(sticky / "moved")], user=users["mallory"][0],
                          group=users["mallory"][1], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and (sticky / "cache").is_dir()
    # alice's own cache directory made writable by everyone: not used either.
    as_user(users, "alice", "chmod", "0777", str(sticky / "cache"))
    result, log = run_as(users, interpreter, "alice", sticky / "cache")
    assert result["tier"] == "uncached" and "is writable by every user" in log
    assert not forged[1].exists()


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_a_setgid_team_cache_is_shared_by_its_members_and_no_member_can_kill_anothers_process(
        users, interpreter, base):
    team = base / "team"
    team.mkdir()
    os.chown(team, 0, users["team"])
    team.chmod(0o2775)  # the documented setup: setgid, group-writable; members use umask 002
    assert run_as(users, interpreter, "alice", team / "cache", flush=True, umask=0o002)[0]["tier"] == "codegen"
    result, log = run_as(users, interpreter, "bob", team / "cache", umask=0o002, env={"VICTIM_EXIT_AT_ONCE": "1"})
    assert result == {"tier": "disk", "right": True, "trusted": True}, log
    assert "not using" not in log
    # bob's counters are a file only bob may write: alice truncating it would SIGBUS his process.
    counters = [p for p in (team / "cache" / "stats").iterdir() if p.stat().st_uid == users["bob"][0]]
    assert counters
    for path in counters:
        done = subprocess.run(["truncate", "-s", "0", str(path)], user=users["alice"][0], group=users["alice"][1],
                              extra_groups=[users["team"]], capture_output=True, timeout=60)
        assert done.returncode != 0 and path.stat().st_size > 0
    # Group-writable but not setgid: not deliberately shared, not used by another member.
    loose = base / "loose"
    loose.mkdir()
    os.chown(loose, users["bob"][0], users["team"])
    loose.chmod(0o775)
    result, log = run_as(users, interpreter, "bob", loose, umask=0o002)
    assert result["tier"] == "uncached" and "is writable by group" in log


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_another_users_cache_is_used_only_where_an_administrator_trusts_it_and_never_by_root(
        users, interpreter, base):
    bobs = base / "bobs"
    bobs.mkdir()
    os.chown(bobs, *users["bob"])
    assert run_as(users, interpreter, "bob", bobs / "cache", flush=True)[0]["tier"] == "codegen"
    result, log = run_as(users, interpreter, "alice", bobs / "cache")
    assert result["tier"] == "uncached" and users["names"]["bob"] in log
    trusted = {"CODEGEN_CACHE_TRUSTED_DIRS": f"/nowhere:{bobs}/*"}
    assert run_as(users, interpreter, "alice", bobs / "cache", env=trusted)[0]["tier"] == "disk"
    # Root owns nothing of another user's (git's rule): not used by root either, unless trusted.
    result, log = run_as(users, interpreter, "root", bobs / "cache")
    assert result["tier"] == "uncached" and users["names"]["bob"] in log
    assert run_as(users, interpreter, "root", bobs / "cache", env=trusted)[0]["tier"] == "disk"


def test_the_trust_rule_on_directories_of_this_user(tmp_path, caplog):
    from codegen_cache._storage._trust import untrusted

    own = tmp_path / "own"
    own.mkdir()
    assert untrusted(own) is None
    assert untrusted(own / "not" / "made" / "yet") is None
    link = tmp_path / "link"
    link.symlink_to(own)
    assert untrusted(link) is None
    own.chmod(0o777)
    found = untrusted(link)  # followed: the directory it leads to is writable by everyone
    assert found is not None and found.directory == str(own) and "writable by every user" in found.reason
    from codegen_cache._cli._doctor import check_filesystem

    report = check_filesystem(link, cc.Settings())  # codegen-cache doctor says so too
    assert not report["trusted"] and any("not trusted" in p for p in report["problems"])
    assert untrusted(link, [str(own)]) is None and untrusted(link, ["*"]) is None
    assert untrusted(link, [f"{tmp_path}/*"]) is None and untrusted(link, [f"{tmp_path}/other"]) is not None
    own.chmod(0o755)
    (own / "compiled").mkdir(mode=0o777)
    (own / "compiled").chmod(0o777)
    assert untrusted(own) is None  # its own rule covers the directory and its parents only
    found = untrusted(own, inside=["compiled", "source"])
    assert found is not None and found.directory == str(own / "compiled")
    cache = cc.CodegenCache(own)
    assert not cache.trusted and "writable by every user" in caplog.text
    (own / "compiled").chmod(0o755)
    (own / "compiled" / "keys").mkdir(mode=0o755)
    (own / "compiled" / "keys").chmod(0o777)  # whoever writes there decides which value file a lookup reads
    found = untrusted(own, inside=["compiled", "compiled/keys", "source", "source/keys"])
    assert found is not None and found.directory == str(own / "compiled" / "keys")
    assert not cc.CodegenCache(own).trusted
