"""shell_out_per_step: for 10 s every step ends with a metrics hook that shells out (`nvidia-smi
--query-gpu=...`, as monitoring snippets do; a short python3 child where there is no nvidia-smi):
the main thread forks, then sleeps in wait4() until the child exits; the GPU idles meanwhile.
Trainer on CPUs 2-3 (the children inherit them). Culprits: the children (each its own pid)."""

import shutil
import subprocess
import sys

from common import Scenario, Trainer

sc = Scenario("shell_out_per_step", "subprocess_wait", "each step runs nvidia-smi (a metrics hook) for 10 s",
              job_cpus=[2, 3])
tr = Trainer(sc)
tr.warmup()
SMI = shutil.which("nvidia-smi")
ARGV = [SMI, "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader"] if SMI else \
    [sys.executable, "-S", "-c", "import json, os; print(json.dumps(dict(os.environ))[:10])"]
children: list[int] = []


def hooked_step() -> None:
    """A training step, then the metrics hook: run the command and wait for it."""
    tr.step()
    child = subprocess.Popen(ARGV, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    children.append(child.pid)
    child.communicate()


def end() -> None:
    comm = "nvidia-smi" if SMI else "python3"
    for pid in children:
        sc.add_culprit(pid, [pid], comm)


sc.extra["command"] = ARGV
sc.note(f"window steps: the usual step, then {'nvidia-smi' if SMI else 'a python3 -S child (no nvidia-smi here)'} "
        "run and waited for; baseline and recovery: the step alone.")
sc.standard_phases(tr.step, lambda: None, end, hooked_step)
