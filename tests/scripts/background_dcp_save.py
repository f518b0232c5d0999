"""Three sharded background saves with sprite's stager, the training loop going on while each is written
(tests/test_dcp_write.py).

    background_dcp_save.py OUT [MODE [DEVICE]]

MODE: torch's async checkpointer, "process" (the default) or "thread". DEVICE: "cpu" (the default; a one-rank gloo
world) or "cuda" (gloo and NCCL). A two-layer model under FSDP2 and Adam; right after each save returns, optimizer
steps change every value in place on the device (the copies off the device may still be queued, then), before the
save is waited for. Writes OUT/result.json: per save, whether torch's reader loads the folder equal to the state at
the save call, the staged buffers' addresses (equal from save to save when they are reused) and the number of
blocks of memory they lie in.
"""

import json
import os
import sys


def main(out: str, mode: str = "process", device: str = "cpu") -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    from torch.distributed.fsdp import fully_shard

    from sprite.runtime.ckpt import background
    from sprite.runtime.ckpt import save as hashed_save

    backend = "cpu:gloo,cuda:nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"file://{out}/store", rank=0, world_size=1)
    torch.manual_seed(0)
    width = 2048 if device == "cuda" else 8  # on a device: copies long enough to be still queued when steps start
    model = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Linear(width, width), torch.nn.Linear(width, 2))
    model.to(device)
    fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)

    def step():
        optimizer.zero_grad()
        model(torch.randn(3, 4, device=device)).sum().backward()
        optimizer.step()

    def flat(state) -> dict:
        got = {}
        for key, value in state.items():
            if isinstance(value, dict):
                got.update({f"{key}.{k}": v for k, v in flat(value).items()})
            elif isinstance(value, torch.Tensor):
                got[key] = (value.full_tensor() if hasattr(value, "full_tensor") else value).cpu()
        return got

    os.environ["SPRITE_CHECKPOINT_WRITER"] = mode  # as sprite run --checkpoint-writer sets it
    saves = []
    for number in range(3):
        step()
        state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
        want = {key: value.clone() for key, value in flat(state).items()}
        folder = os.path.join(out, f"ckpt{number}")
        with hashed_save.collecting() as pending:
            hashed_save.dcp_save(state, folder, background.group())
        for _ in range(3):  # the training loop goes on while the save is written
            step()
        pending[0].run()
        blank = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
        dcp.load(blank, checkpoint_id=folder)
        got = flat(blank)
        buffers = hashed_save._stagers[mode].host.buffers
        locals_ = [b.to_local() if hasattr(b, "to_local") else b for b in buffers]
        saves.append({"equal": sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want),
                      "keys": len(want),
                      "addresses": [b.data_ptr() for b in locals_],
                      "dtensors": sum(hasattr(b, "to_local") for b in buffers),
                      "blocks": len({b.untyped_storage().data_ptr() for b in locals_ if b.numel()})})
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(saves, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
