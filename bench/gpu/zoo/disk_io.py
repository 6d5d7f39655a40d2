"""disk_io: for 10 s the main thread reads every batch from a file on disk that is not in the page
cache (O_DIRECT, or posix_fadvise DONTNEED where O_DIRECT is refused), sleeping in D state on the
IO, then trains on it (CPUs 10-11). Before the window: a 2 GiB file is written, synced and the
page cache dropped. Phase A trains from memory. No culprit process: the feeder's own reads."""

import mmap
import os
import random

from common import Scenario, Trainer

sc = Scenario("disk_io", "disk_io", "uncached reads of each batch from a 2 GiB file on the main thread for 10 s",
              job_cpus=[10, 11])
PATH = os.environ.get("ZOO_DISK_FILE", "/var/tmp/zoo_disk_io.bin")
SIZE = (2048 if sc.cuda else 256) << 20
CHUNK = 256 << 10
tr = Trainer(sc)
torch = tr.torch
batch_bytes = tr.batch * tr.in_dim * 4
try:
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
    io = {"direct": True}
    try:
        io["fd"] = os.open(PATH, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        io["direct"] = False
        io["fd"] = os.open(PATH, os.O_RDONLY)
    buf = mmap.mmap(-1, batch_bytes)  # page-aligned, as O_DIRECT wants
    view = memoryview(buf)
    rng = random.Random(0)
    tr.warmup()

    def read_chunk(off: int, pos: int) -> None:
        if io["direct"]:
            try:
                os.preadv(io["fd"], [view[off:off + CHUNK]], pos)
                return
            except OSError as exc:  # the file system took O_DIRECT at open but not at read: page cache + fadvise
                sc.note(f"O_DIRECT read refused ({exc}); reading through the page cache with fadvise DONTNEED.")
                os.close(io["fd"])
                io["fd"], io["direct"] = os.open(PATH, os.O_RDONLY), False
        os.posix_fadvise(io["fd"], pos, CHUNK, os.POSIX_FADV_DONTNEED)
        os.preadv(io["fd"], [view[off:off + CHUNK]], pos)

    def read_batch() -> None:
        for off in range(0, batch_bytes, CHUNK):  # random aligned chunks: no readahead to help
            read_chunk(off, rng.randrange(0, SIZE // CHUNK) * CHUNK)
        x = torch.frombuffer(buf, dtype=torch.float32).view(tr.batch, tr.in_dim).nan_to_num_(0.0).clamp_(-10, 10)
        y = torch.zeros(tr.batch, dtype=torch.long)
        tr.step(x, y)

    sc.note(f"window steps: {batch_bytes >> 10} KiB read as {CHUNK >> 10} KiB random chunks, then a "
            "training step on it.")
    sc.extra.update(file=PATH, file_bytes=SIZE, read_chunk_bytes=CHUNK, batch_bytes=batch_bytes)
    sc.standard_phases(tr.step, lambda: None, lambda: None, read_batch)
    sc.extra["o_direct"] = io["direct"]
    sc.write_truth(baseline=(sc.marks["baseline"], sc.marks["window"]),
                   window=(sc.marks["window"], sc.marks["recovery"]))
finally:
    try:
        os.unlink(PATH)
    except OSError:
        pass
