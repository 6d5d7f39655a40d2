"""pageable_copies: 256 MiB host->device copies, from a pinned tensor for 8 s, then from a pageable
(unpinned) one for 10 s, then pinned again (CPUs 8-9).

A pageable source makes the driver stage the copy through its own pinned buffer, chunk by chunk,
on the calling thread: each cudaMemcpyAsync becomes synchronous and several times slower, and the
thread's CPU time goes into memcpy. Steps are copies (each followed by a synchronize). No culprit
process: the cause is the feeder's own copies."""

from common import Scenario

sc = Scenario("pageable_copies", "pageable_copies",
              "256 MiB H2D copies from pageable instead of pinned memory for 10 s", job_cpus=[8, 9])
import torch  # noqa: E402

MIB = 256 if sc.cuda else 8
n = MIB * (1 << 20) // 4
pageable = torch.ones(n)
if sc.cuda:
    pinned = torch.ones(n).pin_memory()
else:
    pinned = torch.ones(n)
    sc.note("cpu smoke: no pinned memory without CUDA; both phases copy from pageable memory")
dst = torch.empty(n, device=sc.device)


def copy_from(src):
    def step() -> None:
        dst.copy_(src, non_blocking=True)
        if sc.cuda:
            torch.cuda.synchronize()
    return step


for _ in range(5):
    copy_from(pinned)()
    copy_from(pageable)()
sc.extra["copy_bytes"] = n * 4
sc.note(f"steps are {MIB} MiB H2D copies (dst.copy_(src, non_blocking=True) + synchronize), pinned src "
        "outside the window.")
sc.standard_phases(copy_from(pinned), lambda: None, lambda: None, copy_from(pageable))
