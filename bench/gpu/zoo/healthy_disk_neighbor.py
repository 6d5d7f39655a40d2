"""healthy_disk_neighbor (control): the training loop (CPU 3) while another process `backupd` on CPU 8 writes and
fsyncs 128 MiB files to /var/tmp back to back for the whole 15 s (a backup or another job's checkpoints): the disk
is busy, the trainer never touches it. Window: none. throughput_ratio: first half over second half."""

import os

from common import Scenario, Trainer, spawn_python, stop, tids_of

sc = Scenario("healthy_disk_neighbor", "none", "a training loop beside a process that writes and fsyncs 128 MiB "
              "files back to back, 15 s, no cause", job_cpus=[3], culprit_cpus=[8], control=True)
PATH = "/var/tmp/zoo_backupd.bin"
BACKUP = f"""
import os
block = os.urandom(8 << 20)
while True:
    with open({PATH!r}, 'wb') as fh:
        for _ in range(16):
            fh.write(block)
        fh.flush()
        os.fsync(fh.fileno())
"""
tr = Trainer(sc)
tr.warmup()
backupd = spawn_python(BACKUP, "backupd", sc.culprit_cpus)
try:
    b0 = sc.mark("baseline")
    sc.run_for(7.5 * sc.scale, tr.step)
    mid = sc.mark("half")
    sc.run_for(7.5 * sc.scale, tr.step)
    b1 = sc.mark("end")
    sc.extra["decoys"] = [{"pid": backupd.pid, "tids": tids_of(backupd.pid) or [backupd.pid], "comm": "backupd",
                           "span_ns": [b0, b1]}]
    sc.note("control: the loop alone on CPU 3 while backupd writes and fsyncs 128 MiB files on CPU 8 all along; "
            "baseline_ns is the whole run; throughput_ratio compares its two halves.")
    sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
finally:
    stop([backupd])
    try:
        os.unlink(PATH)
    except OSError:
        pass
