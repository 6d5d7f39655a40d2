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
    direct = True
    try:
        fd = os.open(PATH, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        direct = False
        fd = os.open(PATH, os.O_RDONLY)
    buf = mmap.mmap(-1, batch_bytes)  # page-aligned, as O_DIRECT wants
    view = memoryview(buf)
    rng = random.Random(0)
    tr.warmup()

    def read_batch() -> None:
        for off in range(0, batch_bytes, CHUNK):  # random aligned chunks: no readahead to help
            pos = rng.randrange(0, SIZE // CHUNK) * CHUNK
            if not direct:
                os.posix_fadvise(fd, pos, CHUNK, os.POSIX_FADV_DONTNEED)
            try:
                os.preadv(fd, [view[off:off + CHUNK]], pos)
            except OSError:
                os.posix_fadvise(fd, pos, CHUNK, os.POSIX_FADV_DONTNEED)
                os.close(os.dup(fd))
                os.pread(fd, CHUNK, pos)
        x = torch.frombuffer(buf, dtype=torch.float32).view(tr.batch, tr.in_dim).nan_to_num_(0.0).clamp_(-10, 10)
        y = torch.zeros(tr.batch, dtype=torch.long)
        tr.step(x, y)

    sc.extra.update(file=PATH, file_bytes=SIZE, o_direct=direct, read_chunk_bytes=CHUNK, batch_bytes=batch_bytes)
    sc.note(f"window steps: {batch_bytes >> 20} MiB read as {CHUNK >> 10} KiB random chunks "
            f"({'O_DIRECT' if direct else 'fadvise DONTNEED'}) then a training step on it.")
    sc.standard_phases(tr.step, lambda: None, lambda: None, read_batch)
finally:
    try:
        os.unlink(PATH)
    except OSError:
        pass
