"""The single-device arms as plain torch loops: ref32, ref, split and split_premul.

ref32 and ref train the full global batch (fp32; bf16 autocast for ref under bf16-mixed). split and
split_premul replay the distributed shards serially: each rank's rows, in DistributedSampler order, give an
unscaled fp32 shard gradient; split sums them in rank order and divides once by N, split_premul multiplies
each by 1/N before the sum, as DDP's reducer does. Backward always runs outside autocast, as in Lightning's
automatic optimization.
"""

from __future__ import annotations

import pathlib

import torch

from sprite.parity import probes, recipe, store
from sprite.parity.check.recorder import Recorder
from sprite.parity.settings import Settings, shard_rows, step_rows


def _shard_gradient(model, params, ids, labels, rows, autocast) -> tuple[list[torch.Tensor], float]:
    for param in params:
        param.grad = None
    with autocast():
        loss = recipe.row_loss(model, ids[rows], labels[rows])
    loss.backward()
    return [param.grad.detach().clone() for param in params], float(loss)


def _combine(shard_grads: list[list[torch.Tensor]], premultiply: bool) -> list[torch.Tensor]:
    world = len(shard_grads)
    combined = []
    for per_rank in zip(*shard_grads):
        total = per_rank[0] * (1.0 / world) if premultiply else per_rank[0].clone()
        for grad in per_rank[1:]:
            total = total + (grad * (1.0 / world) if premultiply else grad)
        combined.append(total if premultiply else total / world)
    return combined


def _step(arm, settings, step, model, params, ids, labels, autocast) -> tuple[list[list[int]], float]:
    if arm in ("split", "split_premul"):
        shards = [shard_rows(step, rank, settings.world, settings.global_batch) for rank in range(settings.world)]
        results = [_shard_gradient(model, params, ids, labels, rows, autocast) for rows in shards]
        grads = _combine([grads for grads, _ in results], premultiply=arm == "split_premul")
        for param, grad in zip(params, grads):
            param.grad = grad
        return shards, sum(loss for _, loss in results) / len(results)
    rows = step_rows(step, settings.global_batch)
    grads, loss = _shard_gradient(model, params, ids, labels, rows, autocast)
    for param, grad in zip(params, grads):
        param.grad = grad
    return [rows], loss


def run(arm: str, settings: Settings, arm_dir: pathlib.Path, meta: dict) -> None:
    """Trains ``arm`` for settings.steps steps on one device and writes its record.

    Raises ResultError if the arm's namespace already holds a result; UsageError for a bad model/device.
    """
    device = recipe.pick_device(settings.accelerator)
    if arm == "ref32":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    model = recipe.build_model(settings).to(device)
    ids, labels = (t.to(device) for t in recipe.make_rows(settings, model.backbone.config.vocab_size))
    bf16 = settings.precision == "bf16-mixed" and arm != "ref32"
    probe = probes.LinearProbe(model, torch.bfloat16 if bf16 else torch.float32, autocast=bf16)
    meta = {**meta, "world": 1, "device": device.type, "bf16_autocast": bf16}
    recorder = Recorder(arm_dir, 0, meta, model, probe)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=settings.lr)

    def autocast():
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)

    for step in range(settings.steps):
        shards, loss = _step(arm, settings, step, model, params, ids, labels, autocast)
        recorder.before_clip(step, shards, loss)
        torch.nn.utils.clip_grad_norm_(params, settings.clip)
        recorder.after_clip()
        optimizer.step()
        recorder.after_update()
    recorder.finish({"kind": "none", "reason": "one device, no collectives"})
    store.seal(arm_dir, 1)

