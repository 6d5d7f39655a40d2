"""healthy_two_trainers (control): the trainer (CPU 8) and a second, smaller trainer process `trainer2` (CPU 9) on
the same GPU, both stepping all along, 15 s: two light jobs sharing a GPU that neither fills is not a slow job."""

from common import Scenario, Trainer, spawn_python, stop

sc = Scenario("healthy_two_trainers", "none", "a second light trainer process on the same GPU all along, 15 s, "
              "no cause", job_cpus=[8], culprit_cpus=[9], control=True)
OTHER = f"""
import torch
dev = torch.device({sc.device!r})
m = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).to(dev)
opt = torch.optim.SGD(m.parameters(), lr=1e-3)
x, y = torch.randn(1024, 512, device=dev), torch.randint(0, 10, (1024,), device=dev)
while True:
    loss = torch.nn.functional.cross_entropy(m(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    loss.item()
"""
other = spawn_python(OTHER, "trainer2", sc.culprit_cpus, site=True)
tr = Trainer(sc)
tr.warmup()
try:
    b0 = sc.mark("baseline")
    sc.run_for(7.5 * sc.scale, tr.step)
    mid = sc.mark("half")
    sc.run_for(7.5 * sc.scale, tr.step)
    b1 = sc.mark("end")
    sc.note(f"control: trainer2 (pid {other.pid}) steps a small MLP on the same GPU all along; baseline_ns is the "
            "whole run; throughput_ratio compares its first and second halves.")
    sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
finally:
    stop([other])
