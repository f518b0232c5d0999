"""Resume the 1-device and the DDP epoch-1 checkpoints of a `sprite ckpt-check` directory under FSDP2.

    sprite run --devices 2 --strategy fsdp fsdp2_cross_resume.py DIR

DIR is a copy of a check directory. sprite's FSDP2Strategy resumes each checkpoint into DIR/cross/<arm>; then
Lightning's own ModelParallelStrategy tries the 1-device one, and rank 0 writes what it raised to
DIR/cross/lightning.txt (the evidence behind sprite.runtime.ckpt.fsdp2_load).
"""

import json
import pathlib
import sys

import lightning as L
from lightning.pytorch.strategies import ModelParallelStrategy

from sprite.parity.ckpt.fit import fit
from sprite.parity.ckpt.module import CkptModule, FitPlan
from sprite.parity.ckpt.roles import checkpoint
from sprite.parity.ckpt.settings import CkptSettings

out = pathlib.Path(sys.argv[1])
settings = CkptSettings.from_dict(json.loads((out / "run.json").read_text()))
for arm in ("single", "ddp"):
    plan = FitPlan(out=out, target=f"cross/{arm}", meta={"arm": arm, "role": "cross", "fault": None},
                   load=checkpoint(arm, "killed", 1), gather=True)
    fit(settings, plan, "fsdp")

plan = FitPlan(out=out, target="cross/lightning", meta={}, load=checkpoint("single", "killed", 1))
trainer = L.Trainer(strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1), max_epochs=2,
                    use_distributed_sampler=False, logger=False, enable_checkpointing=False, enable_progress_bar=False)
try:
    trainer.fit(CkptModule(settings, plan, fsdp=True), ckpt_path=str(out / plan.load))
    outcome = "resumed"
except Exception as err:  # what Lightning raises is the point of this run
    outcome = f"{type(err).__name__}: {err}"
if trainer.global_rank == 0:
    (out / "cross" / "lightning.txt").write_text(outcome)
