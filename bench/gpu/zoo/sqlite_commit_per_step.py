"""sqlite_commit_per_step: every step records its metrics in a local SQLite database (as experiment trackers
with a file backend do). Baseline: rows are committed every 200 steps. For 10 s every step commits, with
synchronous=FULL and a rollback journal: each commit writes and fsyncs the journal and the database file, the
main thread asleep in fsync. CPUs 10-11. No culprit process: the feeder's own writes."""

import os
import sqlite3

from common import Scenario, Trainer

sc = Scenario("sqlite_commit_per_step", "disk_io", "a SQLite commit (synchronous=FULL) after every step for 10 s",
              job_cpus=[10, 11])
PATH = "/var/tmp/zoo_metrics.sqlite"
for suffix in ("", "-journal"):
    try:
        os.unlink(PATH + suffix)
    except OSError:
        pass
db = sqlite3.connect(PATH)
db.execute("PRAGMA journal_mode=DELETE")
db.execute("PRAGMA synchronous=FULL")
db.execute("CREATE TABLE metrics (step INTEGER, loss REAL, lr REAL, note TEXT)")
db.commit()
tr = Trainer(sc)
tr.warmup()
EVERY = {"n": 200}


def logged_step() -> None:
    loss = tr.step()
    db.execute("INSERT INTO metrics VALUES (?, ?, ?, ?)", (tr.i, loss, 1e-4, "x" * 200))
    if tr.i % EVERY["n"] == 0:
        db.commit()


def start() -> None:
    EVERY["n"] = 1


def end() -> None:
    EVERY["n"] = 200


try:
    sc.note("every step inserts a metrics row; commits every 200 steps in the baseline and recovery, after every "
            "step in the window (synchronous=FULL, rollback journal: fsyncs per commit).")
    sc.standard_phases(logged_step, start, end)
    db.commit()
finally:
    db.close()
    for suffix in ("", "-journal"):
        try:
            os.unlink(PATH + suffix)
        except OSError:
            pass
