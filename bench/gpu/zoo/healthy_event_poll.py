"""healthy_event_poll (control): large bf16 matmuls back to back (8 per step) on CPU 2, the host waiting for each
step by polling a CUDA event (`while not event.query(): pass`) instead of synchronizing: the main thread runs flat
out inside cudaEventQuery calls while the GPU is busy all the time, 15 s. Nothing staged: a busy host that waits
for a busy GPU is not a slow job."""

from common import Scenario

sc = Scenario("healthy_event_poll", "none", "large bf16 matmuls; the host polls a CUDA event for each step, 15 s, "
              "no cause", job_cpus=[2], control=True)
import torch  # noqa: E402

n = 8192 if sc.cuda else 256
a = torch.randn(n, n, device=sc.device, dtype=torch.bfloat16)
b = torch.randn(n, n, device=sc.device, dtype=torch.bfloat16)
c = torch.empty(n, n, device=sc.device, dtype=torch.bfloat16)
polls = [0]


def step() -> None:
    for _ in range(8):
        torch.matmul(a, b, out=c)
    if sc.cuda:
        done = torch.cuda.Event()
        done.record()
        while not done.query():
            polls[0] += 1


for _ in range(3):
    step()
b0 = sc.mark("baseline")
sc.run_for(7.5 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(7.5 * sc.scale, step)
b1 = sc.mark("end")
sc.extra["event_polls"] = polls[0]
sc.note(f"control: steps are 8 matmuls {n}x{n} bf16, then cudaEventQuery polled until done ({polls[0]} polls); "
        "baseline_ns is the whole run; throughput_ratio compares its first and second halves.")
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
