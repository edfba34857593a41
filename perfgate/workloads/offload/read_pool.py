"""A fixed set of I/O threads that run one batch of preads at a time, as an offloading pager does.

Why not ThreadPoolExecutor: a future per read costs tens of microseconds of Python on a 2-core
machine, comparable to the reads being measured. Here a batch is a list of read chains; the
caller wakes only min(threads, chains) workers, each pulls chains from a shared counter and runs
the chain's preads in order, and the caller sleeps until the last worker is done. The GIL is
released inside os.preadv, so reads of different workers overlap in the kernel and the device.

A chain of one read is "parallel segments"; a chain of three reads is "one expert read
sequentially by one thread" - the two strategies the seed compares.
"""
from __future__ import annotations

import itertools
import os
import threading
import time

Read = tuple[int, memoryview]  # (file offset, destination buffer; its length is the read length)


class ShortRead(OSError):
    pass


def pread_exact(fd: int, off: int, view: memoryview) -> None:
    """Fill `view` from `off`; a short read is an error unless it stops at end of file (an O_DIRECT
    read widened to 4 KiB may reach past the last byte of the file)."""
    n = os.preadv(fd, [view], off)
    if n != len(view) and off + n != os.fstat(fd).st_size:
        raise ShortRead(f"pread at offset {off}: wanted {len(view)} bytes, got {n}")


def run_chain(fd: int, chain: list[Read]) -> None:
    for off, view in chain:
        pread_exact(fd, off, view)


class ReadPool:
    """`threads` persistent workers; `run(fd, chains)` returns when every chain has been read."""

    def __init__(self, threads: int):
        if threads < 1:
            raise ValueError(f"a read pool needs at least one thread, got {threads}")
        self.threads = threads
        self._go = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._stop = False
        self._fd = -1
        self._chains: list[list[Read]] = []
        self._next = itertools.count()
        self._active = 0
        self._error: BaseException | None = None
        self.chain_s: list[float] = []
        self._workers = [threading.Thread(target=self._loop, name=f"read-{i}", daemon=True) for i in range(threads)]
        for w in self._workers:
            w.start()

    def run(self, fd: int, chains: list[list[Read]]) -> float:
        """Read all chains; returns wall seconds from wake-up to the last byte.

        Afterwards `chain_s[i]` holds how long chain i took from its first pread to its last.
        """
        self.chain_s = [0.0] * len(chains)
        if not chains:
            return 0.0
        n_active = min(self.threads, len(chains))
        self._fd, self._chains, self._next = fd, chains, itertools.count()
        self._active, self._error = n_active, None
        self._done.clear()
        t0 = time.perf_counter()
        self._go.release(n_active)
        self._done.wait()
        wall = time.perf_counter() - t0
        if self._error is not None:
            raise self._error
        return wall

    def _loop(self) -> None:
        while True:
            self._go.acquire()
            if self._stop:
                return
            chains, fd = self._chains, self._fd
            try:
                while True:
                    i = next(self._next)
                    if i >= len(chains):
                        break
                    t0 = time.perf_counter()
                    run_chain(fd, chains[i])
                    self.chain_s[i] = time.perf_counter() - t0
            except BaseException as exc:  # surfaced to the caller of run()
                self._error = exc
            with self._lock:
                self._active -= 1
                if self._active == 0:
                    self._done.set()

    def close(self) -> None:
        self._stop = True
        self._go.release(self.threads)
        for w in self._workers:
            w.join(timeout=5)

    def __enter__(self) -> "ReadPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Arena:
    """Destination memory for reads, like a pager's expert slots: one page-aligned anonymous mapping,
    touched once up front so page faults are not timed, handed out as 4 KiB-aligned views
    (O_DIRECT needs aligned buffers; buffered reads do not mind)."""

    ALIGN = 4096

    def __init__(self, nbytes: int):
        import mmap

        self.nbytes = -(-max(nbytes, 1) // self.ALIGN) * self.ALIGN
        self._map = mmap.mmap(-1, self.nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self._map.write(b"\0" * self.nbytes)  # fault every page in now
        self._view = memoryview(self._map)

    def views(self, lengths: list[int]) -> list[memoryview]:
        """Consecutive aligned views of the given lengths (raises if they do not fit)."""
        out, pos = [], 0
        for n in lengths:
            if pos + n > self.nbytes:
                raise ValueError(f"arena of {self.nbytes} bytes cannot hold reads of {sum(lengths)} bytes")
            out.append(self._view[pos:pos + n])
            pos = -(-(pos + n) // self.ALIGN) * self.ALIGN
        return out

    @staticmethod
    def bytes_needed(lengths: list[int]) -> int:
        return sum(-(-n // Arena.ALIGN) * Arena.ALIGN for n in lengths)


class PooledFile:
    """Mixin for readers that own one open fd and lazily created thread pools, closed together.

    Subclasses (dataclasses) define ``fd`` and ``_pools``; this keeps the pool cache and the
    tear-down in one place for the device probe and the expert reader."""

    fd: int
    _pools: dict

    def pool(self, threads: int) -> "ReadPool":
        if threads not in self._pools:
            self._pools[threads] = ReadPool(threads)
        return self._pools[threads]

    def close(self) -> None:
        for p in self._pools.values():
            p.close()
        self._pools.clear()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
