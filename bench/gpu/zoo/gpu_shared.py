"""gpu_shared: a second process `gpuhog` (CPU 5) runs large bf16 matmuls back to back on the same
GPU for 10 s while the trainer (CPU 4) trains.

gpuhog starts, initialises CUDA and warms up before the baseline (so its start-up is not in the
window) and waits for a "go" line on stdin. During the window the trainer's kernels queue behind
gpuhog's: its loss.item() waits (sleeps in the driver) longer; its CPUs stay free. Culprit: gpuhog."""

from common import Scenario, Trainer, spawn_python, stop, tids_of

sc = Scenario("gpu_shared", "gpu_shared", "another process (gpuhog) saturates the same GPU with bf16 matmuls for 10 s",
              job_cpus=[4], culprit_cpus=[5])
HOG = """
import sys, time, torch
dev = sys.argv[1]
n = 8192 if dev == 'cuda' else 256
a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
c = a @ b
if dev == 'cuda':
    torch.cuda.synchronize()
print('ready', flush=True)
seconds = float(sys.stdin.readline().split()[1])
end = time.monotonic() + seconds
k = 0
while time.monotonic() < end:
    for _ in range(16):
        torch.matmul(a, b, out=c)
    if dev == 'cuda':
        torch.cuda.synchronize()
    k += 16
print('matmuls', k, flush=True)
"""
hog = spawn_python(f"import sys\nsys.argv[1:] = [{sc.device!r}]\n" + HOG, "gpuhog", sc.culprit_cpus,
                   site=True, stdin=True, stdout=True)
tr = Trainer(sc)
tr.warmup()
line = hog.stdout.readline()
assert line.strip() == "ready", f"gpuhog did not start: {line!r}"


def start() -> None:
    hog.stdin.write(f"go {sc.window_s}\n")
    hog.stdin.flush()


def end() -> None:
    sc.add_culprit(hog.pid, tids_of(hog.pid), "gpuhog")
    out = hog.stdout.readline().split()
    if out and out[0] == "matmuls":
        sc.extra["culprit_matmuls"] = int(out[1])
    stop([hog], timeout=15)


sc.standard_phases(tr.step, start, end)
