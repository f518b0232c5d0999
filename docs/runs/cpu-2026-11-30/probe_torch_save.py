"""Scratch probe: what torch.save costs per small tensor and in its CRC-32, on this machine (the figures quoted in
sprite/runtime/dcp_write.py's docstring). Medians of 3."""
import os, statistics, tempfile, time

import torch
from torch.utils.serialization import config

folder = tempfile.mkdtemp()
big = torch.randn(128 << 20)  # 512 MiB
small = [torch.randn(896 * 8) for _ in range(3000)]
rows = {"torch.save 512 MiB, CRC on": [], "torch.save 512 MiB, CRC off": [], "plain write 512 MiB": [],
        "torch.save per small tensor (us)": []}
for _ in range(3):
    for crc in (True, False):
        config.save.compute_crc32 = crc
        path = os.path.join(folder, "big.pt")
        with open(path, "wb") as out:
            start = time.perf_counter()
            torch.save(big, out)
            rows[f"torch.save 512 MiB, CRC {'on' if crc else 'off'}"].append(time.perf_counter() - start)
        os.unlink(path)
    config.save.compute_crc32 = True
    path = os.path.join(folder, "raw")
    with open(path, "wb") as out:
        start = time.perf_counter()
        out.write(memoryview(big.numpy()).cast("B"))
        rows["plain write 512 MiB"].append(time.perf_counter() - start)
    os.unlink(path)
    path = os.path.join(folder, "small.pt")
    with open(path, "wb") as out:
        start = time.perf_counter()
        for tensor in small:
            torch.save(tensor, out)
        rows["torch.save per small tensor (us)"].append((time.perf_counter() - start) / len(small) * 1e6)
    os.unlink(path)
print("torch", torch.__version__, {key: round(statistics.median(values), 3) for key, values in rows.items()})
