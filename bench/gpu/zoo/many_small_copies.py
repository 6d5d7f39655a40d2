"""many_small_copies: each step's batch (8192 x 512 float32, 16 MiB) comes from pinned host memory.
Baseline and recovery: one copy per step (.to('cuda', non_blocking=True)). For 10 s: 256 copies of
32 rows each (64 KiB: a per-sample .to('cuda', non_blocking=True), as code that moves samples one
by one does), then torch.cat on the GPU. The same bytes cross, but the host makes 256 copy calls
(each a cudaMemcpyAsync plus PyTorch's dispatch and an allocation) that each finish on the GPU
before the next arrives: the main thread launches while the GPU mostly idles (CPUs 2-3). No
culprit: the feeder's own code."""

from common import Scenario, Trainer

PIECES = 256
sc = Scenario("many_small_copies", "launch_bound", f"each step's batch copied to the GPU as {PIECES} small copies "
              "(then torch.cat) for 10 s", job_cpus=[2, 3])
tr = Trainer(sc)
torch = tr.torch
rows = tr.batch // PIECES
NHOST = 4
host_x = torch.randn(NHOST, tr.batch, tr.in_dim)
host_y = torch.randint(0, 10, (NHOST, tr.batch))
if sc.cuda:
    host_x, host_y = host_x.pin_memory(), host_y.pin_memory()
else:
    sc.note("--device cpu: no pinned memory; the copies are CPU to CPU.")
k = [0]


def one_copy_step() -> None:
    """The batch copied to the GPU in one piece, then a step on it."""
    i = k[0] % NHOST
    k[0] += 1
    tr.step(host_x[i].to(tr.dev, non_blocking=True), host_y[i].to(tr.dev, non_blocking=True))


def many_copies_step() -> None:
    """The batch copied to the GPU as PIECES slices of `rows` samples, put together there, then a step on it."""
    i = k[0] % NHOST
    k[0] += 1
    parts = [host_x[i, p * rows:(p + 1) * rows].to(tr.dev, non_blocking=True) for p in range(PIECES)]
    x = torch.cat(parts)
    tr.step(x, host_y[i].to(tr.dev, non_blocking=True))


for _ in range(20):
    one_copy_step()
    many_copies_step()
tr.sync()
sc.extra.update(pieces=PIECES, rows_per_piece=rows, pinned=sc.cuda)
sc.note(f"baseline and recovery: the {tr.batch} x {tr.in_dim} batch copied from pinned memory in one piece; window: "
        f"{PIECES} copies of {rows} rows, then torch.cat on the device.")
sc.standard_phases(one_copy_step, lambda: None, lambda: None, many_copies_step)
