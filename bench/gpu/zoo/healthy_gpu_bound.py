"""healthy_gpu_bound (control): large bf16 matmuls back to back (8 per step, one synchronize), 15 s
on CPU 2: the GPU is busy all the time and the host waits for it; nothing staged."""

from common import Scenario

sc = Scenario("healthy_gpu_bound", "none", "large bf16 matmuls back to back for 15 s, no cause", job_cpus=[2],
              control=True)
import torch  # noqa: E402

n = 8192 if sc.cuda else 256
a = torch.randn(n, n, device=sc.device, dtype=torch.bfloat16)
b = torch.randn(n, n, device=sc.device, dtype=torch.bfloat16)
c = torch.empty(n, n, device=sc.device, dtype=torch.bfloat16)


def step() -> None:
    for _ in range(8):
        torch.matmul(a, b, out=c)
    if sc.cuda:
        torch.cuda.synchronize()


for _ in range(3):
    step()
b0 = sc.mark("baseline")
sc.run_for(7.5 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(7.5 * sc.scale, step)
b1 = sc.mark("end")
sc.note(f"control: steps are 8 matmuls {n}x{n} bf16 + synchronize; baseline_ns is the whole run; "
        "throughput_ratio compares its first and second halves.")
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
