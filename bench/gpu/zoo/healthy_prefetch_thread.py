"""healthy_prefetch_thread (control): a thread `prefetch` copies the next batch from pinned host memory to the GPU on
a side stream and hands it over through a queue (2 deep) with its CUDA event, the pattern many training loops use;
it keeps ahead, so the main thread rarely waits. CPUs 2-3. 15 s, nothing staged. Window: none. throughput_ratio:
first half over second half."""

import queue
import threading

from common import Scenario, Trainer, set_thread_name

sc = Scenario("healthy_prefetch_thread", "none", "a training loop fed by a prefetch thread copying pinned batches on "
              "a side stream, 15 s, no cause", job_cpus=[2, 3], control=True)
tr = Trainer(sc)
tr.warmup()
torch = tr.torch
host = [torch.randn(tr.batch, tr.in_dim).pin_memory() if sc.cuda else torch.randn(tr.batch, tr.in_dim)
        for _ in range(4)]
labels = torch.randint(0, 10, (tr.batch,), device=tr.dev)
ready: queue.Queue = queue.Queue(maxsize=2)
halt = threading.Event()


def prefetch() -> None:
    set_thread_name("prefetch")
    stream = torch.cuda.Stream() if sc.cuda else None
    i = 0
    while not halt.is_set():
        if stream is not None:
            with torch.cuda.stream(stream):
                x = host[i % len(host)].to(tr.dev, non_blocking=True)
                done = torch.cuda.Event()
                done.record(stream)
        else:
            x, done = host[i % len(host)].clone(), None
        while not halt.is_set():
            try:
                ready.put((x, done), timeout=0.2)
                break
            except queue.Full:
                continue
        i += 1


def fed_step() -> None:
    x, done = ready.get()
    if done is not None:
        torch.cuda.current_stream().wait_event(done)
        x.record_stream(torch.cuda.current_stream())  # made on the side stream, used on this one
    tr.step(x, labels)


th = threading.Thread(target=prefetch, daemon=True)
th.start()
try:
    for _ in range(20):
        fed_step()
    b0 = sc.mark("baseline")
    sc.run_for(7.5 * sc.scale, fed_step)
    mid = sc.mark("half")
    sc.run_for(7.5 * sc.scale, fed_step)
    b1 = sc.mark("end")
    sc.note("control: every step trains on a batch a prefetch thread copied from pinned memory on a side stream; "
            "baseline_ns is the whole run; throughput_ratio compares its two halves.")
    sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
finally:
    halt.set()
