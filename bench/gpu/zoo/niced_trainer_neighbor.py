"""niced_trainer_neighbor: the trainer runs at nice 10 on CPU 7; for 10 s a background process `indexer` at nice 0
shares that CPU with a busy loop (a file indexer or a compile job on the same core): at nice 10 the trainer gets
about a tenth of the CPU. Culprit: indexer."""

import os

from common import BUSY_LOOP, Scenario, Trainer, spawn_python, stop, tids_of

sc = Scenario("niced_trainer_neighbor", "cpu_contention", "a nice-0 busy process shares the nice-10 trainer's CPU "
              "for 10 s", job_cpus=[7], culprit_cpus=[7])
os.setpriority(os.PRIO_PROCESS, 0, 10)
tr = Trainer(sc)
tr.warmup()
busy = []


def start() -> None:
    p = spawn_python("import os\nos.setpriority(os.PRIO_PROCESS, 0, 0)\n" + BUSY_LOOP.format(seconds=sc.window_s + 5),
                     "indexer", sc.culprit_cpus)
    busy.append(p)


def end() -> None:
    for p in busy:
        sc.add_culprit(p.pid, tids_of(p.pid) or [p.pid], "indexer")
    stop(busy)


sc.note("the trainer at nice 10 (its children inherit it); indexer sets itself back to nice 0.")
sc.standard_phases(tr.step, start, end)
