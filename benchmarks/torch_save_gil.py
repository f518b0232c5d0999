"""Does `torch.save` hold the GIL while it writes a large tensor? (issue 26)

A thread saves a 512 MB CPU tensor to a file (and, for comparison, writes the same bytes with `file.write`, which
releases the GIL) while the main thread spins; the longest gap between two of the main thread's iterations is
how long it was kept from running. Ratios are not the point here: a gap near the write's whole duration means the
GIL was held throughout.

    python benchmarks/torch_save_gil.py [--mb 512] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=512)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    tensor = torch.randn(args.mb * 1024 * 1024 // 4)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        def save():
            with open(os.path.join(tmp, "x.pt"), "wb") as out:
                torch.save(tensor, out)

        def write():
            with open(os.path.join(tmp, "x.bin"), "wb") as out:
                out.write(memoryview(tensor.numpy()).cast("B"))

        print(f"torch {torch.__version__}, {args.mb} MB")
        for fn in (save, write, save, write):
            thread = threading.Thread(target=fn)
            gaps, last = [], time.perf_counter()
            began = last
            thread.start()
            while thread.is_alive():
                now = time.perf_counter()
                gaps.append(now - last)
                last = now
            print(f"{fn.__name__}: {last - began:.2f} s, the main thread's longest gap {max(gaps) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
