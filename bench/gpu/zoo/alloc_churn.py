"""alloc_churn: the training loop, and for 10 s each step also makes fresh large intermediates of
a new size and calls torch.cuda.empty_cache(), so the caching allocator returns everything to the
driver and cudaMalloc/cudaFree (synchronising) happen every step (CPUs 8-9). No culprit process:
the cause is the feeder's own allocations."""

from common import Scenario, Trainer

sc = Scenario("alloc_churn", "allocator_churn", "empty_cache() and fresh large tensors every step for 10 s",
              job_cpus=[8, 9])
tr = Trainer(sc)
tr.warmup()
torch = tr.torch
MIB = 1 << 20
state = {"k": 0}


def churn_step() -> None:
    k = state["k"] = state["k"] + 1
    nbytes = ((64 + 8 * (k % 13)) * MIB) if sc.cuda else ((1 + k % 5) * MIB)
    tmp = torch.empty(nbytes // 4, device=sc.device)
    tmp.fill_(1.0)
    extra = tmp[: tr.batch * 16].view(tr.batch, 16) * 2.0
    tr.step()
    del tmp, extra
    if sc.cuda:
        torch.cuda.empty_cache()


sc.note("window steps: a fresh 64-160 MiB tensor of a new size, filled, then the usual step, then empty_cache().")
sc.standard_phases(tr.step, lambda: None, lambda: None, churn_step)
