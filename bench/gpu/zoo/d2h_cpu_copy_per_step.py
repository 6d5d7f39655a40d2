"""d2h_cpu_copy_per_step: for 10 s every step also copies its 256 MiB activation buffer back to the host with
`.cpu()` (to inspect or log it, as debugging code does): a synchronous device-to-host copy into fresh pageable
memory each step, the main thread on the CPU inside the copy call. CPUs 8-9. No culprit process."""

from common import Scenario, Trainer

sc = Scenario("d2h_cpu_copy_per_step", "pageable_copies", "a 256 MiB tensor copied to the host with .cpu() every "
              "step for 10 s", job_cpus=[8, 9])
tr = Trainer(sc)
tr.warmup()
torch = tr.torch
acts = torch.randn((256 if sc.cuda else 8) << 18, device=tr.dev)  # 256 MiB of float32 on the GPU
kept = {"sum": 0.0}


def inspected_step() -> None:
    tr.step()
    host = acts.cpu()  # a fresh pageable tensor each time
    kept["sum"] += float(host[0])


sc.extra["copy_bytes"] = acts.numel() * 4
sc.note(f"window steps: the usual step, then .cpu() of a {acts.numel() * 4 >> 20} MiB GPU tensor; baseline and "
        "recovery: the step alone.")
sc.standard_phases(tr.step, lambda: None, lambda: None, inspected_step)
