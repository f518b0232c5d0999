"""The fixed reference computation every rank runs on its own device: matmuls and one small training step in each
precision checked, each stage's result kept as the sha256 of its bytes. No communication here.

Two kinds of stage:

* ``exact-<precision>``: a product of small-integer matrices whose every value (|sum| <= 256) is exact in
  fp32, bf16 and fp16, so the right answer is known without any device (``criterion.exact_digest``): a golden
  digest for every device kind and torch version.
* ``matmul-<precision>`` and ``train-<precision>``: random inputs from a fixed seed. Their bits depend on the
  device kind, the kernels and the torch version, so they are compared between ranks of the same kind.
"""

from __future__ import annotations

import hashlib
import time

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
EXACT_INNER = 64  # inner dimension of the exact stage: |sum| <= 64 * 2 * 2 = 256, exact in every dtype above
SEED = 28
# The timed repetitions go on past ``repeats`` until they span MIN_SECONDS (at most MAX_REPEATS): the fastest of
# nine 9 ms repetitions on shared, busy CPU cores was 2x the other ranks' in a CI run, a healthy node named slow.
MIN_SECONDS = 0.5
MAX_REPEATS = 200


def exact_inputs(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer matrices in [-2, 2] from a closed formula (``criterion.exact_answer`` builds the same ones)."""
    i = torch.arange(rows).unsqueeze(1)
    k = torch.arange(EXACT_INNER)
    a = (i * 7 + k * 3) % 5 - 2
    j = torch.arange(rows)
    b = (k.unsqueeze(1) * 3 + j * 11 + k.unsqueeze(1) * j) % 5 - 2
    return a, b


def digest(tensor: torch.Tensor) -> str:
    """sha256 of the tensor's bytes in its own dtype (moved to the CPU first)."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest()


def _train_step(device: torch.device, precision: str, autocast: str) -> torch.Tensor:
    """One SGD step of a two-layer MLP from a fixed seed; returns the updated weights, flattened."""
    gen = torch.Generator().manual_seed(SEED + 1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.1)
    model = model.to(device)
    x = torch.randn(32, 64, generator=gen).to(device)
    y = torch.randn(32, 8, generator=gen).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.autocast(autocast, dtype=DTYPES[precision], enabled=precision != "fp32"):
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
    loss.backward()
    optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def run_once(device: torch.device, precisions: tuple[str, ...], size: int, autocast: str,
             fault: str | None = None) -> dict[str, torch.Tensor]:
    """Every stage's result tensor (on ``device``). ``fault`` "wrong-result" changes one element of the first
    stage's result by one unit in the last place (the negative control of a device that computes wrongly)."""
    out = {}
    a_int, b_int = exact_inputs(size)
    gen = torch.Generator().manual_seed(SEED)
    a_rand, b_rand = torch.randn(size, size, generator=gen), torch.randn(size, size, generator=gen)
    for precision in precisions:
        dtype = DTYPES[precision]
        out[f"exact-{precision}"] = a_int.to(device, dtype) @ b_int.to(device, dtype)
        out[f"matmul-{precision}"] = a_rand.to(device, dtype) @ b_rand.to(device, dtype)
        out[f"train-{precision}"] = _train_step(device, precision, autocast)
    if fault == "wrong-result":
        first = next(iter(out.values()))
        first.view(-1)[0] = torch.nextafter(first.view(-1)[0], torch.tensor(float("inf"), dtype=first.dtype,
                                                                              device=first.device))
    return out


def measure(device: torch.device, kind, precisions: tuple[str, ...], size: int, repeats: int,
            fault: str | None = None) -> dict:
    """Runs the computation once untimed (warm-up), then ``repeats`` times and on until the repetitions span
    MIN_SECONDS (at most MAX_REPEATS), each between two device synchronisations. Returns the digests of the last
    run and its times: ``seconds`` (fastest repetition, robust to other work on the machine) and ``all_seconds``.
    The "slow" fault sleeps nine times the repetition's own compute time inside each timed repetition (10x: far past
    --slow-factor even on busy shared cores)."""
    results = run_once(device, precisions, size, kind.autocast, fault)
    times = []
    began = time.perf_counter()
    while len(times) < repeats or (time.perf_counter() - began < MIN_SECONDS and len(times) < MAX_REPEATS):
        kind.synchronize(device)
        start = time.perf_counter()
        results = run_once(device, precisions, size, kind.autocast, fault)
        kind.synchronize(device)
        took = time.perf_counter() - start
        if fault == "slow":
            time.sleep(9 * took)
        times.append(time.perf_counter() - start)
    return {"digests": {name: digest(tensor) for name, tensor in results.items()},
            "seconds": min(times), "all_seconds": times}
