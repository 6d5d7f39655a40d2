"""A Python stand-in for a training loop whose functions are known (tests/collector/test_python_stacks.py): the main
thread builds batches in pure Python; a second thread writes a checkpoint with fsync every 10 ms. It prints `ready`,
waits for a line on stdin, runs for the seconds given, and exits."""

import os
import sys
import tempfile
import threading
import time


def build_batch(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i
    return total


def train_step() -> int:
    return build_batch(100_000)


def write_checkpoint(path: str, stop: threading.Event) -> None:
    while not stop.is_set():
        with open(path, "wb") as f:
            f.write(b"x" * 65536)
            f.flush()
            os.fsync(f.fileno())
        time.sleep(0.01)


def main() -> None:
    seconds = float(sys.argv[1])
    print("ready", flush=True)
    sys.stdin.readline()
    stop = threading.Event()
    with tempfile.TemporaryDirectory() as tmp:
        writer = threading.Thread(target=write_checkpoint, args=(os.path.join(tmp, "ckpt"), stop))
        writer.start()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            train_step()
        stop.set()
        writer.join()


if __name__ == "__main__":
    main()
