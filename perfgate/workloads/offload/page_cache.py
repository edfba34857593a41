"""Make reads of a file really hit the device: drop its page cache, check residency, O_DIRECT buffers.

A read from the page cache costs tens of microseconds; the same read from an SSD costs a
millisecond or more. Measuring an offloading runtime's miss path therefore needs the file's pages
gone before each measured read. Two ways, both per file and without root:

* buffered reads + `posix_fadvise(POSIX_FADV_DONTNEED)`: the kernel drops clean cached pages of the
  range (dirty pages are written first with fdatasync, else they would stay). This is what the seed's
  io_probe did and what a pager that uses plain pread sees.
* `O_DIRECT`: bypasses the cache entirely; offsets, lengths and buffer addresses must be aligned to
  the logical block size, so segment reads are widened to 4 KiB boundaries (`aligned_span`).

`resident_fraction` asks the kernel (mincore on a mapping of the file) which pages are cached, so a
test can verify that the drop worked instead of trusting it. It does not work on tmpfs (pages can't
be dropped there at all): `page_cache_droppable` says so up front.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path

PAGE = mmap.PAGESIZE
DIRECT_ALIGN = 4096
"""Alignment used for O_DIRECT offsets/lengths/buffers; 4 KiB covers 512 B and 4 KiB logical blocks."""

_NO_DROP_FS = {"tmpfs", "ramfs", "devtmpfs", "overlay", "squashfs", "fuse.sshfs", "nfs", "nfs4", "9p"}


def filesystem_type(path: str | Path) -> str:
    """Filesystem type of the mount holding `path` (longest mount-point prefix in /proc/mounts)."""
    path = os.path.realpath(path)
    best, fstype = "", "unknown"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1].replace("\\040", " ")
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, fstype = mnt, parts[2]
    except OSError:
        pass
    return fstype


def page_cache_droppable(path: str | Path) -> tuple[bool, str]:
    """(ok, reason): False where dropping pages cannot make reads hit a device (tmpfs, network fs...)."""
    fstype = filesystem_type(path)
    if fstype in _NO_DROP_FS:
        return False, f"{path} is on {fstype}: its pages cannot be dropped to force device reads"
    return True, fstype


def drop_cache(fd: int, offset: int = 0, length: int = 0, *, sync: bool = False) -> None:
    """Drop cached pages of [offset, offset+length) of an open file (length 0 = to the end).

    sync=True first flushes dirty pages (needed right after writing the file).
    """
    if sync:
        os.fdatasync(fd)
    os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def drop_file_cache(path: str | Path) -> None:
    """Flush and drop every cached page of the file at `path`."""
    fd = os.open(path, os.O_RDONLY)
    try:
        drop_cache(fd, sync=True)
    finally:
        os.close(fd)


_libc = None


def _mincore():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
        _libc.mincore.restype = ctypes.c_int
    return _libc.mincore


def resident_fraction(path: str | Path, offset: int = 0, length: int | None = None) -> float:
    """Fraction of the pages of [offset, offset+length) of `path` that are in the page cache now.

    mmap + mincore: mapping a file and asking residency does not fault pages in.
    """
    size = os.path.getsize(path)
    if length is None:
        length = size - offset
    if length <= 0:
        return 0.0
    start = offset // PAGE * PAGE
    stop = min(size, offset + length)
    span = stop - start
    fd = os.open(path, os.O_RDONLY)
    try:
        # a private (copy-on-write) mapping exposes a writable buffer, which ctypes needs for the
        # address; nothing is written, so every page still refers to the file's page cache
        m = mmap.mmap(fd, span, access=mmap.ACCESS_COPY, offset=start)
    finally:
        os.close(fd)
    try:
        n_pages = (span + PAGE - 1) // PAGE
        vec = (ctypes.c_ubyte * n_pages)()
        anchor = ctypes.c_char.from_buffer(m)
        try:
            rc = _mincore()(ctypes.addressof(anchor), span, vec)
        finally:
            del anchor
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mincore on {path}: {os.strerror(err)}")
        return sum(v & 1 for v in bytes(vec)) / n_pages
    finally:
        m.close()


def aligned_span(offset: int, length: int, align: int = DIRECT_ALIGN) -> tuple[int, int]:
    """Smallest aligned (offset, length) covering [offset, offset+length): what an O_DIRECT read fetches."""
    start = offset // align * align
    stop = -(-(offset + length) // align) * align
    return start, stop - start


def aligned_buffer(nbytes: int, align: int = DIRECT_ALIGN) -> mmap.mmap:
    """A page-aligned, writable buffer usable with os.preadv under O_DIRECT (anonymous mmap)."""
    return mmap.mmap(-1, -(-nbytes // align) * align, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def open_for_reads(path: str | Path, *, direct: bool = False, random_hint: bool = True) -> int:
    """Open a file for measured reads.

    random_hint sets POSIX_FADV_RANDOM (no readahead), as fio does for random workloads and as a
    pager wants: readahead would read bytes that belong to other experts.
    """
    flags = os.O_RDONLY | (os.O_DIRECT if direct else 0)
    fd = os.open(path, flags)
    if random_hint and not direct:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    return fd


def direct_io_supported(path: str | Path) -> tuple[bool, str]:
    """(ok, reason): whether O_DIRECT reads of `path` work here."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError as exc:
        return False, f"O_DIRECT open of {path} failed: {exc.strerror}"
    try:
        buf = aligned_buffer(DIRECT_ALIGN)
        os.preadv(fd, [buf], 0)
        return True, "ok"
    except OSError as exc:
        return False, f"O_DIRECT read of {path} failed: {exc.strerror}"
    finally:
        os.close(fd)
