"""Three sharded background saves in torch's process mode with sprite's stager (tests/test_dcp_write.py).

    process_mode_save.py OUT

A one-rank gloo world, a two-layer model under FSDP2 and Adam; between saves one optimizer step changes every
value. Writes OUT/result.json: per save, whether torch's reader loads the folder equal to the state saved and the
staged buffers' addresses (equal from save to save when they are reused).
"""

import json
import os
import sys


def main(out: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    from torch.distributed.fsdp import fully_shard

    from sprite.runtime.ckpt import dcp_write
    from sprite.runtime.ckpt import save as hashed_save

    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=0, world_size=1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)

    def step():
        optimizer.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()

    def flat(state) -> dict:
        got = {}
        for key, value in state.items():
            if isinstance(value, dict):
                got.update({f"{key}.{k}": v for k, v in flat(value).items()})
            elif isinstance(value, torch.Tensor):
                got[key] = value.full_tensor() if hasattr(value, "full_tensor") else value
        return got

    dcp_write.MODE = "process"
    saves = []
    for number in range(3):
        step()
        state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
        want = {key: value.clone() for key, value in flat(state).items()}
        folder = os.path.join(out, f"ckpt{number}")
        with hashed_save.collecting() as pending:
            hashed_save.dcp_save(state, folder)
        step()  # the training loop goes on while the save is written
        pending[0].run()
        blank = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
        dcp.load(blank, checkpoint_id=folder)
        got = flat(blank)
        buffers = hashed_save.process_stager().host.buffers
        saves.append({"equal": sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want),
                      "keys": len(want),
                      "addresses": [b.to_local().data_ptr() if hasattr(b, "to_local") else b.data_ptr()
                                    for b in buffers],
                      "dtensors": sum(hasattr(b, "to_local") for b in buffers)})
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(saves, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
