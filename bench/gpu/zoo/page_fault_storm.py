"""page_fault_storm: for 10 s each training step also allocates a fresh 256 MiB numpy buffer and
touches every page (glibc maps it anew and unmaps it on free), so the main thread's time outside
CUDA goes to page faults and page allocation/zeroing in the kernel (CPUs 6-7). No culprit process."""

import ctypes

import numpy as np

from common import Scenario, Trainer

sc = Scenario("page_fault_storm", "page_faults", "a fresh 256 MiB buffer touched page by page every step for 10 s",
              job_cpus=[6, 7])
tr = Trainer(sc)
tr.warmup()
NBYTES = (256 if sc.cuda else 32) << 20
# No transparent huge pages for this process: with THP a 256 MiB buffer takes 128 faults of 2 MiB;
# without, 65,536 faults of 4 KiB, which is the storm staged here.
PR_SET_THP_DISABLE = 41
thp_off = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0
sc.note("transparent huge pages "
        f"{'disabled for the process (prctl PR_SET_THP_DISABLE)' if thp_off else 'NOT disabled (prctl failed)'}.")


def fault_step() -> None:
    buf = np.empty(NBYTES, dtype=np.uint8)
    buf[::4096] = 1  # one write per 4 KiB page: a fault and a zeroed page each
    tr.step()
    del buf


sc.extra["buffer_bytes"] = NBYTES
sc.extra["thp_disabled"] = thp_off
sc.standard_phases(tr.step, lambda: None, lambda: None, fault_step)
