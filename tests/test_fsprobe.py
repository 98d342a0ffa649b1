"""_fsprobe: which mount holds a cache directory, network filesystems, scratch directory choice."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

import codegen_cache as cc
from codegen_cache import _log
from codegen_cache._storage import _fsprobe
from codegen_cache._storage._fsprobe import FsReport, probe, scratch_dir

MOUNTS = """\
/dev/vda / ext4 rw,relatime 0 0
proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0
server:/export/home {root}/nfs nfs4 rw,relatime,vers=4.2 0 0
//files/share {root}/smb cifs rw,relatime 0 0
user@host:/data {root}/sshfs fuse.sshfs rw,nosuid,nodev 0 0
/dev/sdb1 {root}/ntfs fuseblk rw,relatime 0 0
tmpfs {root}/nfs/local tmpfs rw,relatime 0 0
tmpfs {root}/ro tmpfs ro,relatime 0 0
tmpfs {root}/noexec tmpfs rw,nosuid,nodev,noexec 0 0
tmpfs {root}/with\\040space tmpfs rw 0 0
server:/a {root}/twice nfs rw 0 0
tmpfs {root}/twice tmpfs rw 0 0
"""


def _fake_mounts(base: Path, tmp_path: Path, monkeypatch) -> Path:
    """A mounts table naming directories under `base`; probe() reads it instead of the real one."""
    root = base / "m"
    for name in ("nfs/local/deeper", "smb", "sshfs", "ntfs", "ro", "noexec", "with space", "twice"):
        (root / name).mkdir(parents=True)
    path = tmp_path / "mounts"
    path.write_text(MOUNTS.format(root=root))
    monkeypatch.setattr(_fsprobe, "MOUNTS_FILE", str(path))
    monkeypatch.setattr(_log.warn_once, "_seen", set())
    return root


@pytest.fixture
def fake_mounts(tmp_path, monkeypatch):
    return _fake_mounts(tmp_path, tmp_path, monkeypatch)


@pytest.fixture
def fake_mounts_without_block_device(tmp_path, monkeypatch):
    """fake_mounts, its directories on tmpfs: like a network filesystem, a filesystem without a
    block device of its own (major device number 0), where the cache reads the mount table."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or _fsprobe.on_block_device(shm) or not os.access(shm, os.W_OK):
        pytest.skip("no writable tmpfs at /dev/shm to stand in for a network filesystem")
    base = Path(tempfile.mkdtemp(dir=shm, prefix="cgc-test-"))
    try:
        yield _fake_mounts(base, tmp_path, monkeypatch)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize(
    ("sub", "fs_type", "network"),
    [
        ("nfs", "nfs4", True),
        ("nfs/cache/not/yet/created", "nfs4", True),  # the nearest existing ancestor decides
        ("nfs/local/deeper", "tmpfs", False),  # the longest mount point wins
        ("smb", "cifs", True),
        ("sshfs/x", "fuse.sshfs", True),
        ("ntfs", "fuseblk", False),
        ("with space", "tmpfs", False),  # \040 in /proc/self/mounts is a space
        ("twice", "tmpfs", False),  # a later mount on the same point hides the earlier one
    ],
)
def test_probe_finds_the_mount_and_its_type(fake_mounts, sub, fs_type, network):
    report = probe(fake_mounts / sub)
    assert isinstance(report, FsReport)
    assert (report.fs_type, report.is_network) == (fs_type, network)
    assert report.mount_point != "/"
    assert bool(report.warnings) == network
    if network:
        assert "Redis remote tier" in report.warnings[0] and fs_type in report.warnings[0]


def test_probe_reports_flags_and_free_space(fake_mounts):
    ro = probe(fake_mounts / "ro")
    assert ro.read_only and not ro.noexec and any("not writable" in w for w in ro.warnings)
    noexec = probe(fake_mounts / "noexec")
    assert noexec.noexec and not noexec.read_only and any("noexec" in w for w in noexec.warnings)
    root = probe(fake_mounts)
    assert (root.fs_type, root.mount_point) == ("ext4", "/")
    assert isinstance(root.free_bytes, int) and root.free_bytes > 0
    assert probe("/proc/self").free_bytes is None  # a pseudo filesystem has no free space to speak of


def test_probe_is_frozen():
    report = probe(".")
    with pytest.raises(AttributeError):
        report.fs_type = "nfs"  # type: ignore[misc]


def test_probe_without_a_mounts_table(tmp_path):
    report = probe(tmp_path, mounts_file=str(tmp_path / "missing"))
    assert (report.fs_type, report.mount_point, report.is_network) == ("unknown", "/", False)


def test_real_mounts_of_this_machine(tmp_path):
    report = probe(tmp_path)
    assert report.mount_point in [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    assert not report.is_network


def test_cache_on_a_network_fs_warns_once_per_directory_when_its_stores_are_first_opened(
        fake_mounts_without_block_device, caplog, cuda_vadd):
    fake_mounts = fake_mounts_without_block_device
    device_mod, target = cuda_vadd
    caplog.set_level(logging.WARNING, logger="codegen_cache")
    made = [cc.CodegenCache(fake_mounts / sub / "cache", min_codegen_time=0, write_behind=False)
            for sub in ("nfs", "nfs", "smb", "nfs/local")]  # nfs/local: tmpfs, no warning
    assert caplog.records == []  # making a cache object reads no mount table (a tilelang hit never opens SQLite)
    for cache in made:
        cache.lower(device_mod, target, compile_device=False)  # the miss's store opens the store's SQLite
        cache.close()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert "nfs4" in messages[0] and "SQLite is not safe" in messages[0] and "CODEGEN_CACHE_REMOTE" in messages[0]
    assert "cifs" in messages[1]


def test_a_cache_on_a_block_device_reads_no_mount_table(fake_mounts, caplog, cuda_vadd):
    # The table names the directory nfs4, but it lies on a filesystem with a block device (no
    # network filesystem has one): opening its stores does not read the table, so no warning.
    # `codegen-cache doctor` (probe) still reads it.
    if not _fsprobe.on_block_device(fake_mounts):
        pytest.skip(f"{fake_mounts} is not on a block device here")
    caplog.set_level(logging.WARNING, logger="codegen_cache")
    cache = cc.CodegenCache(fake_mounts / "nfs" / "cache", min_codegen_time=0, write_behind=False)
    cache.lower(*cuda_vadd, compile_device=False)
    assert cache.lower_with_outcome(*cuda_vadd, compile_device=False)[1].tier == "memory"
    cache.close()
    assert [r.getMessage() for r in caplog.records] == []
    assert probe(fake_mounts / "nfs" / "cache").is_network


def test_on_block_device_tells_a_disk_from_tmpfs_and_proc(tmp_path):
    assert not _fsprobe.on_block_device("/proc/self")  # proc: no block device
    assert not _fsprobe.on_block_device(tmp_path / "absent")  # cannot be stat'ed
    shm = Path("/dev/shm")
    if shm.is_dir():
        assert not _fsprobe.on_block_device(shm)  # tmpfs


def test_scratch_dir_prefers_the_cache_and_sweeps_old_leftovers(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    old_file, old_dir, fresh = scratch / "cgc-old.so", scratch / "cgc-olddir", scratch / "cgc-fresh.so"
    # Not the cache's (no cgc- prefix, or a link): never touched, however old.
    other, foreign, link = scratch / "keep", scratch / "tmpold.so", scratch / "cgc-link"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_bytes(b"x")
    old_file.write_bytes(b"x")
    old_dir.mkdir()
    (old_dir / "lib.o").write_bytes(b"x")
    for path in (fresh, other, foreign):
        path.write_bytes(b"x")
    link.symlink_to(outside)
    two_hours_ago = time.time() - 7200
    for path in (old_file, old_dir, other, foreign, link):
        os.utime(path, (two_hours_ago, two_hours_ago), follow_symlinks=False)
    assert scratch_dir(scratch) == str(scratch)
    assert sorted(p.name for p in scratch.iterdir()) == ["cgc-fresh.so", "cgc-link", "keep", "tmpold.so"]
    assert (outside / "precious").exists()


def test_scratch_dir_refuses_a_tmp_symlink_out_of_the_cache(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "tmp").symlink_to(outside)
    old = outside / "cgc-old.so"
    old.write_bytes(b"x")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert scratch_dir(tmp_path / "cache" / "tmp") != str(tmp_path / "cache" / "tmp")
    assert old.exists()


def test_scratch_dir_falls_back_when_world_writable_without_sticky_bit(tmp_path, monkeypatch):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(os, "geteuid", lambda: -1)  # not ours: share_file_mode leaves it alone
    scratch.chmod(0o777)
    assert scratch_dir(scratch) != str(scratch)


def _mount_tmpfs(path: Path, options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or 'not root'})")


def test_scratch_dir_avoids_a_noexec_mount(tmp_path):
    mnt = tmp_path / "noexec"
    _mount_tmpfs(mnt, "size=1m,noexec")
    try:
        assert probe(mnt).noexec
        assert scratch_dir(mnt / "tmp") != str(mnt / "tmp")
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)

