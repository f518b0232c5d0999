"""Verification spread over ranks (sprite/runtime/ckpt/shared_verify.py): rank 0 checks the listing, every rank
hashes its share, and every rank gets the same verdict. Two real gloo processes; the shares are checked alone."""

from __future__ import annotations

import os
import pickle

import pytest

from sprite import integrity
from sprite.runtime.ckpt import shared_verify


def _sealed(folder, names):
    folder.mkdir()
    for index, name in enumerate(names):
        data = bytes([index]) * (100 + index)
        (folder / name).write_bytes(pickle.dumps(data) if name == ".metadata" else data)  # .metadata: a pickle
    integrity.seal(folder, {"step": 1})
    return folder


def test_the_shares_cover_every_file_once_and_only_the_owner_sees_a_changed_one(tmp_path):
    names = [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "meta.pt"]
    folder = _sealed(tmp_path / "ckpt", names)
    head = integrity.check_listing(folder)
    assert head.valid and sorted(head.manifest["files"]) == sorted(names)
    shares = [shared_verify._share(sorted(head.manifest["files"]), rank, 3) for rank in range(3)]
    assert sorted(sum(shares, [])) == sorted(names)
    assert all(f"__{rank}_0.distcp" in share for rank, share in enumerate(shares))  # each rank its own shards
    data = (folder / "__2_0.distcp").read_bytes()
    os.unlink(folder / "__2_0.distcp")
    (folder / "__2_0.distcp").write_bytes(data[:-1] + b"\xff")  # same size: only its digest tells
    assert integrity.check_listing(folder).valid
    verdicts = [integrity.check_digests(folder, head.manifest, share) for share in shares]
    owner = next(rank for rank, share in enumerate(shares) if "__2_0.distcp" in share)
    assert [v.valid for v in verdicts] == [rank != owner for rank in range(3)]
    assert "__2_0.distcp does not match its SHA-256" in verdicts[owner].reason


def _rank(rank: int, world: int, port: int, folder: str, out: str) -> None:
    import json

    import torch.distributed as dist

    from sprite.runtime.ckpt import shared_verify

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    verdict = shared_verify.verify(shared_verify.DefaultGroup(), folder)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
        json.dump([verdict.valid, verdict.reason], handle)
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_agree_on_a_verdict_only_one_of_them_could_see(tmp_path):
    import json

    import torch.multiprocessing as mp

    from sprite.launch.rendezvous import free_port

    folder = _sealed(tmp_path / "ckpt", ["a.distcp", "b.distcp"])
    results = []
    for case in ("intact", "changed"):
        if case == "changed":  # b.distcp is rank 1's share: rank 0 never reads it
            data = (folder / "b.distcp").read_bytes()
            os.unlink(folder / "b.distcp")
            (folder / "b.distcp").write_bytes(data[:-1] + b"\x00")
        out = tmp_path / case
        out.mkdir()
        mp.start_processes(_rank, args=(2, free_port(), str(folder), str(out)), nprocs=2, start_method="spawn")
        results.append([json.loads((out / f"rank{r}.json").read_text()) for r in range(2)])
    assert results[0] == [[True, ""], [True, ""]]
    (valid0, reason0), (valid1, reason1) = results[1]
    assert not valid0 and not valid1 and reason0 == reason1 and "b.distcp does not match its SHA-256" in reason0


class _One:
    """Stands in for a Lightning strategy in a world of one (a named fake: no process group)."""

    is_global_zero, global_rank, world_size = True, 0, 1

    def broadcast(self, obj):
        return obj


def _changed(path):
    data = path.read_bytes()
    os.unlink(path)
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size: only the digest tells


def test_shard_files_can_be_hashed_in_the_background_while_the_rest_is_checked_first(tmp_path, monkeypatch):
    import threading

    folder = _sealed(tmp_path / "ckpt", [".metadata", "__0_0.distcp", "meta.pt"])
    seen = []
    real = integrity.check_digests
    monkeypatch.setattr(integrity, "check_digests", lambda target, body, names: (
        seen.append((threading.current_thread().name, tuple(names))), real(target, body, names))[1])
    pending = shared_verify.start(_One(), folder, background=True)
    assert pending.later and pending.verdict().valid and not pending.later
    assert seen[0] == ("MainThread", (".metadata", "meta.pt"))
    assert seen[1][0].startswith("sprite-verify") and seen[1][1] == ("__0_0.distcp",)
    _changed(folder / "__0_0.distcp")
    pending = shared_verify.start(_One(), folder, background=True)
    assert pending.later  # not known before the shard file is hashed
    verdict = pending.verdict()
    assert not verdict.valid and "__0_0.distcp does not match its SHA-256" in verdict.reason
    assert not shared_verify.start(_One(), folder).verdict().valid  # and as before, all at once


def test_a_changed_metadata_file_is_refused_before_any_load(tmp_path):
    folder = _sealed(tmp_path / "ckpt", [".metadata", "__0_0.distcp"])
    _changed(folder / ".metadata")  # torch unpickles it first: never left for later
    pending = shared_verify.start(_One(), folder, background=True)
    assert not pending.later and ".metadata does not match its SHA-256" in pending.verdict().reason
