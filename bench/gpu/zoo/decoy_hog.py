"""decoy_hog (control): the training loop alone on CPU 3 while, from +8 s for 10 s, three busy-looping
processes `hogd` run on CPUs 4-5, not the trainer's. The trainer is unaffected: nothing is wrong
with the job, and the busy processes elsewhere on the host must not be blamed. 21 s; window_ns
null; the truth's `decoys` lists the hogs (pid, tids, comm, CPUs, when); throughput_ratio compares
the 8 s before the decoys with the 10 s they ran (both ~1 when they do not touch the trainer)."""

from common import BUSY_LOOP, Scenario, Trainer, map_cpus, spawn_python, stop, tids_of

sc = Scenario("decoy_hog", "none", "three busy loops on CPUs 4-5 (not the trainer's CPU 3) for 10 s, no cause",
              job_cpus=[3], control=True)
HOG_CPUS = [c for c in map_cpus([4, 5]) if c not in sc.job_cpus] or map_cpus([4, 5])
if set(HOG_CPUS) & set(sc.job_cpus):
    sc.note(f"this machine has too few CPUs to keep the decoys off the trainer's CPU: they share {HOG_CPUS}.")
tr = Trainer(sc)
tr.warmup()
hogs = []
b0 = sc.mark("baseline")
sc.run_for(8.0 * sc.scale, tr.step)
d0 = sc.mark("decoys")
try:
    for _ in range(3):
        hogs.append(spawn_python(BUSY_LOOP.format(seconds=10.0 * sc.scale + 5), "hogd", HOG_CPUS))
    sc.run_for(10.0 * sc.scale, tr.step)
    d1 = sc.mark("decoys_end")
    decoys = [{"pid": p.pid, "tids": tids_of(p.pid) or [p.pid], "comm": "hogd", "cpus": [4, 5],
               "cpus_used_here": HOG_CPUS, "span_ns": [d0, d1]} for p in hogs]
finally:
    stop(hogs)
sc.run_for(3.0 * sc.scale, tr.step)
b1 = sc.mark("end")
sc.extra["decoys"] = decoys
sc.note("control: baseline_ns is the whole run; throughput_ratio compares the span before the decoys with the span "
        "they ran. The hogd processes are decoys, not culprits.")
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, d0), (d0, d1)))
