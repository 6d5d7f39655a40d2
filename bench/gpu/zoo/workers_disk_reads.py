"""workers_disk_reads: the loop is fed by DataLoader(num_workers=2) whose workers read every sample of
a batch at a random record index of a file of 512-byte uint8 records (2 GiB, written, fsync'ed and
the page cache dropped before the baseline). Baseline and recovery: indices in a small region
(64 MiB, read back into the page cache before the baseline, gathered through mmap). For 10 s:
indices anywhere in the file, each sample one O_DIRECT read of the 4 KiB page that holds it
(posix_fadvise DONTNEED where O_DIRECT is refused): each worker sleeps in D state on 8,192 reads a
batch and the main thread waits for batches from workers that wait on the disk. Trainer on CPUs
8-9, workers on 10 and 11 (no CPU is shared). Culprits: the pt_data_worker processes. The file is
removed at the end."""

import mmap
import multiprocessing
import os
import random
import time

import numpy as np

from common import Scenario, Trainer, comm_of, tids_of

sc = Scenario("workers_disk_reads", "disk_io", "2 DataLoader workers read each batch's samples from a 2 GiB file "
              "with uncached O_DIRECT random reads for 10 s", job_cpus=[8, 9], culprit_cpus=[10, 11])
PATH = os.environ.get("ZOO_WORKERS_DISK_FILE", "/var/tmp/zoo_workers_disk.bin")
SIZE = (2048 if sc.cuda else 256) << 20
HOT = 64 << 20  # the cached region the baseline reads from
PAGE = 4096
tr = Trainer(sc)
torch = tr.torch
RECORD = tr.in_dim  # one uint8 sample
uncached = multiprocessing.RawValue("b", 0)  # shared with the forked workers: read the whole file, O_DIRECT
fallbacks = multiprocessing.RawValue("i", 0)  # workers that had to read through the page cache + fadvise instead


class RecordFile(torch.utils.data.Dataset):
    """Index b: one batch of samples at random record indices. Baseline: gathered from the cached region
    (mmap'ed); window: one O_DIRECT read of the 4 KiB page holding each sample, anywhere in the file."""

    def __init__(self) -> None:
        self.io: dict = {}

    def __len__(self) -> int:
        return 1 << 40

    def open(self) -> dict:
        """Per worker (after the fork): the cached region mapped, an O_DIRECT descriptor, an aligned page, an RNG."""
        if self.io.get("pid") != os.getpid():
            io = {"pid": os.getpid(), "direct": True, "page": mmap.mmap(-1, PAGE),
                  "rng": np.random.default_rng(os.getpid()),
                  "hot": np.memmap(PATH, dtype=np.uint8, mode="r", shape=(HOT // RECORD, RECORD))}
            try:
                io["fd"] = os.open(PATH, os.O_RDONLY | os.O_DIRECT)
            except OSError:
                io["fd"], io["direct"] = os.open(PATH, os.O_RDONLY), False
                fallbacks.value += 1
            io["view"] = memoryview(io["page"])
            self.io = io
        return self.io

    def read_page(self, io: dict, pos: int) -> None:
        """The 4 KiB page at pos into io["page"], not from the page cache."""
        if io["direct"]:
            try:
                os.preadv(io["fd"], [io["view"]], pos)
                return
            except OSError:  # O_DIRECT taken at open, refused at read: page cache + fadvise from here on
                io["direct"] = False
                fallbacks.value += 1
        os.posix_fadvise(io["fd"], pos, PAGE, os.POSIX_FADV_DONTNEED)
        os.preadv(io["fd"], [io["view"]], pos)

    def __getitem__(self, b: int):
        io = self.open()
        if uncached.value:
            rows = np.empty((tr.batch, RECORD), dtype=np.uint8)
            out, page = memoryview(rows).cast("B"), io["view"]
            for k, r in enumerate(io["rng"].integers(0, SIZE // RECORD, tr.batch).tolist()):
                pos = r * RECORD
                self.read_page(io, pos - pos % PAGE)
                within = pos % PAGE
                out[k * RECORD:(k + 1) * RECORD] = page[within:within + RECORD]
        else:
            rows = io["hot"][io["rng"].integers(0, HOT // RECORD, tr.batch)]
        x = torch.from_numpy(rows)
        return x, (x[:, 0] % 10).long()


def pin_worker(k: int) -> None:
    os.sched_setaffinity(0, [sc.culprit_cpus[k % len(sc.culprit_cpus)]])


def write_file() -> None:
    """The record file, synced; then the page cache dropped and the baseline's region read back in."""
    with open(PATH, "wb") as fh:
        block = os.urandom(16 << 20)
        for _ in range(SIZE // len(block)):
            fh.write(block)
        fh.flush()
        os.fsync(fh.fileno())
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
    except OSError as exc:
        sc.note(f"could not drop caches ({exc}).")
    with open(PATH, "rb") as fh:
        while fh.tell() < HOT and fh.read(4 << 20):
            pass


def direct_read_latency(n: int = 200) -> float | None:
    """Microseconds per random uncached 4 KiB read of the file (O_DIRECT, QD1), timed here before the workers
    start: what a window batch costs a worker is about window_reads_per_batch times this."""
    buf = mmap.mmap(-1, PAGE)
    rng = random.Random(1)
    try:
        fd = os.open(PATH, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return None
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            os.preadv(fd, [buf], rng.randrange(HOT // PAGE, SIZE // PAGE) * PAGE)
        return round((time.perf_counter() - t0) / n * 1e6, 1)
    except OSError:
        return None
    finally:
        os.close(fd)


workers: list[int] = []
it = None
try:
    write_file()
    sc.extra["o_direct_read_us"] = direct_read_latency()
    loader = torch.utils.data.DataLoader(RecordFile(), batch_size=None, num_workers=2, pin_memory=sc.cuda,
                                         prefetch_factor=2, persistent_workers=True, worker_init_fn=pin_worker)
    it = iter(loader)
    workers = [w.pid for w in it._workers]

    def fed_step() -> None:
        """A step on the next batch from the workers: uint8 to the GPU, made float there."""
        x, y = next(it)
        x = x.to(tr.dev, non_blocking=True).float().div_(255.0)
        tr.step(x, y.to(tr.dev, non_blocking=True))

    def start() -> None:
        uncached.value = 1

    def end() -> None:
        uncached.value = 0
        for pid in workers:
            sc.add_culprit(pid, tids_of(pid), comm_of(pid), cpus=sorted(os.sched_getaffinity(pid)))

    for _ in range(20):
        fed_step()
    tr.sync()
    sc.extra.update(file=PATH, file_bytes=SIZE, cached_region_bytes=HOT, read_bytes=PAGE, record_bytes=RECORD,
                    window_reads_per_batch=tr.batch)
    sc.note(f"every step (all phases) trains on a {tr.batch}-sample uint8 batch of {RECORD} B records at random "
            f"indices, read by the 2 workers: baseline and recovery gathered from a {HOT >> 20} MiB region in the "
            f"page cache (mmap), the window one O_DIRECT read of the {PAGE} B page holding each sample, anywhere in "
            f"the {SIZE >> 20} MiB file ({sc.extra['o_direct_read_us']} us a read, timed before the workers "
            "started). Batches already queued when the window began (up to 4) came from the cache.")
    sc.standard_phases(fed_step, start, end, before_truth=lambda: sc.extra.update(o_direct_fallbacks=fallbacks.value))
finally:
    if it is not None:
        it._shutdown_workers()
    try:
        os.unlink(PATH)
    except OSError:
        pass
