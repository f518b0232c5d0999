"""finish.finish and finish.abandon (sprite/runtime/finish.py): finished ranks end together, rank 0 last; a
failing rank leaves its gloo group at once, without waiting for a peer. The end-to-end test in test_run_e2e.py catches the abort it prevents only when the abort happens (about 1 run
in 10); this one checks the mechanism itself, every time, with two real gloo processes."""

from __future__ import annotations

import json
import os
import time

import pytest


def _rank(rank: int, world: int, port: int, out: str, ending: str) -> None:
    """One gloo rank that ends with ``finish.<ending>()`` and records whether its group is left and how long the
    call took. Rank 1 comes later: for abandon, 3 s still in the group; for finish, 1 s, then a teardown of 2 s."""
    import torch
    import torch.distributed as dist

    from sprite.runtime import finish

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    dist.all_reduce(torch.ones(4))
    if ending == "fail-late":  # rank 1 fails 1 s after rank 0 reached the end of its script
        finish.WAIT_ALL_SECONDS = 30.0  # bounds the test without the fix
        if rank == 1:
            time.sleep(1)
        ending = "abandon" if rank == 1 else "finish"
    elif rank == 1 and ending == "abandon":
        time.sleep(3)  # still in the group while rank 0 leaves: abandon must not wait for it
    elif rank == 1:
        time.sleep(1)  # the script ends later on rank 1, and its teardown takes 2 s more
        destroy = dist.destroy_process_group
        dist.destroy_process_group = lambda *args: (destroy(*args), time.sleep(2))[0]
    start = time.monotonic()
    getattr(finish, ending)()
    record = {"initialized": dist.is_initialized(), "seconds": time.monotonic() - start}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
        json.dump(record, handle)


@pytest.mark.slow
def test_abandon_destroys_the_group_without_waiting_for_a_peer(tmp_path):
    import torch.multiprocessing as mp

    from sprite.launch.rendezvous import free_port
    from sprite.runtime import finish

    finish.abandon()  # no process group here: nothing to do, and no error
    mp.start_processes(_rank, args=(2, free_port(), str(tmp_path), "abandon"), nprocs=2, start_method="spawn")
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["initialized"] for r in records] == [False, False]
    assert records[0]["seconds"] < 2.5  # rank 0 did not wait for rank 1's 3 s


@pytest.mark.slow
def test_finished_ranks_wait_for_each_other_destroy_the_group_and_rank_0_leaves_last(tmp_path):
    """docs/long-runs.md, Ending together: every rank waits for the others (through the store), destroys its
    process group, and rank 0, whose process holds the store, returns only once the others have released it."""
    import torch.multiprocessing as mp

    from sprite.launch.rendezvous import free_port

    mp.start_processes(_rank, args=(2, free_port(), str(tmp_path), "finish"), nprocs=2, start_method="spawn")
    first, second = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert [first["initialized"], second["initialized"]] == [False, False]
    # rank 0 waited for rank 1 to arrive (1 s) and then to release it after its own teardown (2 s more)
    assert first["seconds"] >= 2.8 and second["seconds"] >= 2.0


@pytest.mark.slow
def test_a_finished_rank_stops_waiting_as_soon_as_a_peer_fails(tmp_path):
    """A rank that fails after its peers finished (a script raising after its fit) marks itself in the store, so
    they leave at once instead of waiting WAIT_ALL_SECONDS for it: under mpiexec nothing else would end them."""
    import torch.multiprocessing as mp

    from sprite.launch.rendezvous import free_port

    mp.start_processes(_rank, args=(2, free_port(), str(tmp_path), "fail-late"), nprocs=2, start_method="spawn")
    first, second = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert [first["initialized"], second["initialized"]] == [False, False]
    assert 0.9 <= first["seconds"] < 10  # rank 0 waited for rank 1's 1 s, not for WAIT_ALL_SECONDS
