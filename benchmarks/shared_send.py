"""What handing a staged checkpoint to torch's checkpoint process costs the rank, with sprite's shared buffers as one
block (``sprite.runtime.ckpt.stage.ONE_BLOCK``) against a block each, measured in the same run.

torch's process mode (``dcp.async_save`` with ``AsyncCheckpointerType.PROCESS``, torch 2.11
torch/distributed/checkpoint/_async_process_executor.py) sends the staged state dict through a
``multiprocessing`` pipe of the spawn context and waits for the answer. Here the same: sprite's ``HostCopy`` stages
``--tensors`` tensors into shared memory, once laid out as views of one block and once a block each, and a spawned
child receives each copy through such a pipe and answers with its tensor count. Printed for each arm, medians over
``--repeats``:
- send: one send and its answer, alone;
- lost: a Python-bound loop of small tensor operations (its steps hold and release the GIL, as a training loop's
  dispatch does) runs while a thread sends the copy ``--sends`` times; the time the sends took less what the steps
  done meanwhile take alone (``--steps`` steps timed just before), divided by the sends, is what each send cost the
  loop.

    python benchmarks/shared_send.py [--tensors 872] [--numel 4096] [--repeats 5] [--sends 3] [--steps 400]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import threading
import time

ARMS = ("one block", "a block each")


def _child(conn) -> None:
    while True:
        state = conn.recv()
        if state is None:
            return
        conn.send(len(state))


def _step(value):
    for _ in range(100):
        value = value * 1.0001 + 0.1
    return value


def _alone(steps: int, value) -> float:
    """Seconds a step of the loop takes with nothing beside it."""
    start = time.perf_counter()
    for _ in range(steps):
        value = _step(value)
    return (time.perf_counter() - start) / steps


def _send(conn, state) -> float:
    start = time.perf_counter()
    conn.send(state)
    conn.recv()
    return time.perf_counter() - start


def _beside(work, step: float, value) -> tuple[float, float]:
    """``(seconds, seconds lost)``: the loop runs while a thread does ``work()``; what the loop lost is the time
    ``work`` took less what the steps done meanwhile would have taken alone (``step`` each)."""
    thread = threading.Thread(target=work)
    start, done = time.perf_counter(), 0
    thread.start()
    while thread.is_alive():
        value = _step(value)
        done += 1
    elapsed = time.perf_counter() - start
    return elapsed, elapsed - done * step


def _lost(conn, state, sends: int, step: float, value) -> float:
    """Seconds the loop lost while a thread sent ``state`` ``sends`` times."""
    return _beside(lambda: [_send(conn, state) for _ in range(sends)], step, value)[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=872, help="tensors staged (the 0.5B shape's shared buffers)")
    parser.add_argument("--numel", type=int, default=4096, help="elements of each float32 tensor")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sends", type=int, default=3, help="sends beside each timed loop")
    parser.add_argument("--steps", type=int, default=400, help="steps timed alone before each arm's sends")
    args = parser.parse_args()
    if min(args.tensors, args.numel, args.repeats, args.sends, args.steps) < 1:
        parser.error("--tensors, --numel, --repeats, --sends and --steps must be 1 or more")
    import torch
    import torch.multiprocessing  # noqa: F401  (torch's reductions for multiprocessing's pickler)

    from sprite.runtime.ckpt import stage

    torch.set_num_threads(1)
    state = {f"t{n}": torch.randn(args.numel) for n in range(args.tensors)}
    copies = {}
    for arm in ARMS:
        stage.ONE_BLOCK = arm == "one block"
        copies[arm] = stage.HostCopy(shared=True).copy(state)
    context = multiprocessing.get_context("spawn")
    conn, child_end = context.Pipe()
    child = context.Process(target=_child, args=(child_end,), daemon=True)
    child.start()
    child_end.close()
    value = torch.ones(64)
    figures = {arm: {"send": [], "extra": []} for arm in ARMS}
    for arm in ARMS:
        _send(conn, copies[arm])  # warm: the child's imports
    for _ in range(args.repeats):
        for arm in ARMS:  # interleaved, so drift in the machine touches both alike
            figures[arm]["send"].append(_send(conn, copies[arm]))
            step = _alone(args.steps, value)
            figures[arm]["extra"].append(_lost(conn, copies[arm], args.sends, step, value) / args.sends)
    conn.send(None)
    child.join(30)
    send = {arm: statistics.median(figures[arm]["send"]) for arm in ARMS}
    extra = {arm: statistics.median(figures[arm]["extra"]) for arm in ARMS}
    print(f"{args.tensors} tensors of {args.numel} float32, {args.repeats} repeats, torch {torch.__version__}")
    for arm in ARMS:
        print(f"{arm}: one send {send[arm] * 1000:.1f} ms; the loop beside the sends lost {extra[arm] * 1000:.1f} ms"
              " a send")
    loss = f"{extra['one block'] / extra['a block each']:.3f}x" if extra["a block each"] > 0 else "n/a (no loss)"
    print(f"one block / a block each: send {send['one block'] / send['a block each']:.3f}x, the loop's loss {loss}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
