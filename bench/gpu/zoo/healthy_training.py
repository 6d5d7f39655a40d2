"""healthy_training (control): a well-fed training loop, batches already on the GPU, a step of a
few ms, 15 s on CPU 3, nothing staged. Window: none. throughput_ratio: first half over second half."""

from common import Scenario, Trainer

sc = Scenario("healthy_training", "none", "a well-fed training loop for 15 s, no cause", job_cpus=[3], control=True)
tr = Trainer(sc)
tr.warmup()
b0 = sc.mark("baseline")
sc.run_for(7.5 * sc.scale, tr.step)
mid = sc.mark("half")
sc.run_for(7.5 * sc.scale, tr.step)
b1 = sc.mark("end")
sc.note("control: baseline_ns is the whole run; throughput_ratio compares its first and second halves.")
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
