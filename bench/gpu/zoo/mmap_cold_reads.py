"""mmap_cold_reads: the dataset is a memory-mapped file of 512-byte records (np.memmap, as many
datasets are read). The main thread gathers each batch's rows itself. Baseline: rows from a 64 MiB
region already in the page cache. For 10 s: rows at random anywhere in a 1 GiB file whose pages
were dropped from the cache, with readahead off (MADV_RANDOM): every row is a major page fault,
the thread asleep in D state while the disk reads the page, without any read() call. CPUs 10-11.
No culprit process: the feeder's own faults."""

import mmap
import os

import numpy as np

from common import Scenario, Trainer

sc = Scenario("mmap_cold_reads", "disk_io", "random rows of a memory-mapped 1 GiB file out of the page cache, "
              "on the main thread, for 10 s", job_cpus=[10, 11])
PATH = "/var/tmp/zoo_mmap_records.bin"
SIZE = (1024 if sc.cuda else 128) << 20
ROW = 512
HOT = 64 << 20
tr = Trainer(sc)
torch = tr.torch
BATCH = 2048
try:
    with open(PATH, "wb") as fh:
        block = os.urandom(16 << 20)
        for _ in range(SIZE // len(block)):
            fh.write(block)
        fh.flush()
        os.fsync(fh.fileno())
    fd = os.open(PATH, os.O_RDONLY)
    os.posix_fadvise(fd, 0, SIZE, os.POSIX_FADV_DONTNEED)  # this file's pages out of the page cache
    records = np.memmap(PATH, dtype=np.uint8, mode="r", shape=(SIZE // ROW, ROW))
    records._mmap.madvise(mmap.MADV_RANDOM)  # no readahead: each cold row is its own page fault
    rows_hot = HOT // ROW
    np.asarray(records[:rows_hot]).sum()  # the hot region read once: in the page cache for the baseline
    rng = np.random.default_rng(0)
    tr.warmup()

    def batch_step(cold: bool) -> None:
        idx = np.sort(rng.integers(0, records.shape[0] if cold else rows_hot, BATCH))
        rows = records[idx]  # the gather: page faults where the pages are not cached
        x = torch.from_numpy(np.ascontiguousarray(rows)).to(tr.dev, non_blocking=True).float().div_(255.0)
        y = (x[:, 0] * 10).long().clamp_(0, 9)
        tr.step(x, y)

    sc.note(f"every step trains on {BATCH} rows of {ROW} B gathered from the memmap; baseline and recovery from the "
            f"first {HOT >> 20} MiB (cached); window from anywhere in {SIZE >> 20} MiB (dropped, MADV_RANDOM).")
    sc.extra.update(file=PATH, file_bytes=SIZE, row_bytes=ROW, rows_per_step=BATCH)
    sc.standard_phases(lambda: batch_step(False), lambda: None, lambda: None, lambda: batch_step(True))
finally:
    try:
        os.unlink(PATH)
    except OSError:
        pass
