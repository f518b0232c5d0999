"""Table-driven rank resolution for every launcher flavour, and the cluster environments built on it."""

from __future__ import annotations

import pytest

from sprite.errors import UsageError
from sprite.runtime.environment import ENVIRONMENTS, HydraEnvironment, PALSEnvironment
from sprite.runtime.ranks import Ranks, detect_flavour, resolve_ranks

# Each flavour's own names for rank, local rank, world size and node id (None: the launcher exports none).
NATIVE = {
    "pals": ("PALS_RANKID", "PALS_LOCAL_RANKID", None, "PALS_NODEID"),
    "hydra": ("PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE", None),
    "openmpi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_NODE_RANK"),
    "srun": ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NODEID"),
    "local": ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK"),
    "torchrun": ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK"),
}
HOST = "vm-b"


def world(flavour, rank=3, local=1, size=4, node=None, **extra) -> dict:
    """The variables a 2-node x 2-rank launch by ``flavour`` gives one rank (sprite's own exports included)."""
    r, lr, ws, nd = NATIVE[flavour]
    env = {r: str(rank), lr: str(local), "SPRITE_DEVICES": "2", "SPRITE_NUM_NODES": "2", "WORLD_SIZE": str(size)}
    if ws:
        env[ws] = str(size)
    if nd and node is not None:
        env[nd] = str(node)
    env.update({k: v for k, v in extra.items() if v is not None})
    return {k: v for k, v in env.items() if v != "DEL"}


def cases(flavour):
    r, lr, ws, nd = NATIVE[flavour]
    generic_differs = r != "RANK"
    yield "agreeing", world(flavour), Ranks(3, 1, 4, 1)
    yield "agreeing generic copies", world(flavour, RANK="3", LOCAL_RANK="1", SPRITE_WORLD_SIZE="4"), Ranks(3, 1, 4, 1)
    if generic_differs:
        yield "stale RANK=0", world(flavour, RANK="0"), [f"{r}=3", "RANK=0", "stale"]
        yield "conflicting LOCAL_RANK", world(flavour, LOCAL_RANK="0"), [f"{lr}=1", "LOCAL_RANK=0"]
    yield "conflicting world size", world(flavour, SPRITE_WORLD_SIZE="8"), ["WORLD_SIZE=4", "SPRITE_WORLD_SIZE=8"]
    yield "missing world size", world(flavour, **{k: "DEL" for k in ("WORLD_SIZE", ws) if k}), ["No world size"]
    yield "missing rank", world(flavour, **{r: "DEL"}), ["No rank", r]
    yield "non-integer rank", world(flavour, **{r: "three"}), [f"{r}='three'", "not an integer"]
    yield "non-integer world size", world(flavour, WORLD_SIZE="4x"), ["WORLD_SIZE='4x'", "not an integer"]
    yield "rank beyond world", world(flavour, rank=5, local=1, size=4), ["Rank 5", "world of 4"]
    yield "host list gives node", world(flavour, rank=2, local=0, SPRITE_HOSTS=f"vm-a,{HOST}.example.org"), Ranks(
        2, 0, 4, 1
    )
    yield "host not in list", world(flavour, SPRITE_HOSTS="n1,n2"), [HOST, "SPRITE_HOSTS=n1,n2"]
    yield "node from rank // devices", world(flavour, rank=2, local=0), Ranks(2, 0, 4, 1)
    if nd:
        yield "node from launcher id", world(flavour, rank=1, local=1, node=0), Ranks(1, 1, 4, 0)
    yield "round-robin placement", world(flavour, rank=1, local=0, SPRITE_HOSTS=f"vm-a,{HOST}"), ["must be rank 2"]
    yield "empty value counts as unset", world(flavour, LOCAL_RANK="" if lr != "LOCAL_RANK" else None), Ranks(3, 1, 4, 1)


TABLE = [pytest.param(f, env, want, id=f"{f}-{name}") for f in NATIVE for name, env, want in cases(f)]


@pytest.mark.parametrize("flavour, env, want", TABLE)
def test_resolve_ranks(flavour, env, want):
    if isinstance(want, Ranks):
        assert resolve_ranks(env, flavour, hostname=HOST) == want
    else:
        with pytest.raises(UsageError) as err:
            resolve_ranks(env, flavour, hostname=HOST)
        for part in want:
            assert part in str(err.value)


def test_every_flavour_has_at_least_12_cases():
    for flavour in NATIVE:
        assert len(list(cases(flavour))) >= 12, flavour


def test_pals_world_size_is_not_taken_from_pals():
    env = {"PALS_RANKID": "0", "PALS_LOCAL_RANKID": "0", "PMIX_RANK": "0"}
    with pytest.raises(UsageError, match="WORLD_SIZE"):
        resolve_ranks(env, "pals", hostname=HOST)
    assert resolve_ranks({**env, "SPRITE_WORLD_SIZE": "1"}, "pals", hostname=HOST) == Ranks(0, 0, 1, 0)


def test_pmix_rank_must_agree_under_pals():
    with pytest.raises(UsageError, match="PMIX_RANK=2"):
        resolve_ranks(world("pals", PMIX_RANK="2"), "pals", hostname=HOST)


@pytest.mark.parametrize(
    "env, flavour",
    [
        ({"SPRITE_LAUNCHER": "srun", "PMI_RANK": "0"}, "srun"),
        ({"PALS_RANKID": "0", "PMI_RANK": "0"}, "pals"),
        ({"OMPI_COMM_WORLD_RANK": "0"}, "openmpi"),
        ({"PMI_RANK": "0"}, "hydra"),
        ({"LOCAL_RANK": "0"}, "local"),
        ({}, None),
    ],
)
def test_detect_flavour(env, flavour):
    assert detect_flavour(env) == flavour


def test_environment_refuses_a_world_lightning_computes_differently():
    env = PALSEnvironment(env=world("pals", MASTER_PORT="29500"), hostname=HOST)
    assert (env.global_rank(), env.local_rank(), env.world_size(), env.node_rank()) == (3, 1, 4, 1)
    assert env.creates_processes_externally and env.main_port == 29500
    env.set_global_rank(3)
    with pytest.raises(UsageError, match="global rank is 2"):
        env.set_global_rank(2)
    with pytest.raises(UsageError, match="world size .* is 6"):
        env.validate_settings(num_devices=3, num_nodes=2)


def test_environment_main_address_and_port():
    env = HydraEnvironment(env={**world("hydra"), "SPRITE_HOSTS": "h1,h2"}, hostname="h2")
    assert env.main_address == "h1"
    with pytest.raises(UsageError, match="MASTER_PORT"):
        env.main_port


def test_one_environment_class_per_flavour(monkeypatch):
    assert set(ENVIRONMENTS) == set(NATIVE)
    monkeypatch.delenv("PALS_RANKID", raising=False)
    assert not PALSEnvironment.detect()
    monkeypatch.setenv("PALS_RANKID", "0")
    assert PALSEnvironment.detect()
