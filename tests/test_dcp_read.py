"""sprite's reader of torch.distributed.checkpoint folders (sprite/runtime/ckpt/dcp_read.py): it loads what torch's own
reader loads, refuses what weights_only refuses, reads plain tensors without torch.load, and a rank that fails
fails every rank. Folders are written by torch's own dcp.save; two real gloo processes for the agreement."""

from __future__ import annotations

import gc
import json
import os
import pickle
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from sprite.runtime.ckpt import dcp_read

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int8, torch.uint8,
          torch.bool, torch.complex64]


def _save(state: dict, folder) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(state, checkpoint_id=folder, no_dist=True)


def _load(state: dict, folder, reader=None) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, storage_reader=reader or dcp.FileSystemReader(folder), no_dist=True)
    return state


def _blank(state: dict) -> dict:
    """Zeros of each tensor's shape and dtype, contiguous whatever the saved tensor's layout (as a model's own
    tensors are), and an empty value of each other type."""
    return {key: torch.zeros(value.shape, dtype=value.dtype) if isinstance(value, torch.Tensor) else type(value)()
            for key, value in state.items()}


@st.composite
def _tensor(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(1, 9), min_size=0, max_size=3))
    if draw(st.integers(0, 9)) == 0 and shape:
        shape[0] = 0  # now and then an empty tensor
    seed = draw(st.integers(0, 2 ** 16))
    generator = torch.Generator().manual_seed(seed)
    base = (torch.rand(shape, generator=generator) * 200 - 100).to(dtype)
    layout = draw(st.sampled_from(["plain", "transposed", "strided", "narrowed"]))
    if layout == "transposed" and base.dim() >= 2:
        return base.transpose(0, 1)
    if layout == "strided" and base.dim() >= 1:
        return base[::2]
    if layout == "narrowed" and base.dim() >= 1 and base.shape[0] >= 2:
        return base[1:]
    return base


@settings(max_examples=60)
@given(tensors=st.lists(_tensor(), min_size=1, max_size=8), numbers=st.lists(st.integers(), max_size=3),
       span=st.sampled_from([1, 700, 4096, 64 << 20]), threads=st.integers(1, 3))
def test_the_reader_loads_what_torchs_reader_loads(tmp_path_factory, tensors, numbers, span, threads):
    folder = tmp_path_factory.mktemp("dcp")
    state = {f"t{index}": tensor for index, tensor in enumerate(tensors)}
    state.update({f"n{index}": number for index, number in enumerate(numbers)})
    _save(state, folder)
    theirs = _load(_blank(state), folder)
    saved = dcp_read.SPAN_BYTES, dcp_read.READ_THREADS
    dcp_read.SPAN_BYTES, dcp_read.READ_THREADS = span, threads  # runs of one item or of many, 1-3 read-ahead
    try:
        ours = _load(_blank(state), folder, dcp_read.Reader(folder))
    finally:
        dcp_read.SPAN_BYTES, dcp_read.READ_THREADS = saved
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            assert ours[key].dtype == value.dtype and ours[key].shape == value.shape
            assert torch.equal(ours[key], theirs[key]) and torch.equal(ours[key], value), key
        else:
            assert ours[key] == theirs[key] == value


def test_a_tensor_stored_transposed_is_loaded_in_its_own_order(tmp_path):
    stored = torch.arange(20.0).reshape(4, 5).t()  # torch's writer keeps these strides (its storage is exact)
    _save({"t": stored}, tmp_path)
    ours = _load({"t": torch.zeros(5, 4)}, tmp_path, dcp_read.Reader(tmp_path))
    assert torch.equal(ours["t"], stored)


def test_a_tensor_at_any_byte_offset_of_its_file_is_loaded(tmp_path):
    offsets = set()
    for pad in range(4):  # a bigger item first, of another length each time: torch's writer puts it first
        folder = tmp_path / f"pad{pad}"
        stored = torch.arange(20.0).reshape(4, 5).t()  # read as a tensor, not as bytes: its layout is not dense
        _save({"pad": torch.ones(4000 + pad, dtype=torch.bool), "t": stored}, folder)
        metadata = pickle.loads((folder / ".metadata").read_bytes())
        offsets |= {info.offset % 4 for index, info in metadata.storage_data.items() if index.fqn == "t"}
        ours = _load({"pad": torch.zeros(4000 + pad, dtype=torch.bool), "t": torch.zeros(5, 4)}, folder,
                     dcp_read.Reader(folder))
        assert torch.equal(ours["t"], stored)
    assert offsets - {0}  # some were not aligned for float32


def test_plain_tensors_are_read_without_torch_load(tmp_path, monkeypatch):
    state = {"w": torch.randn(33, 7), "b": torch.randn(7).to(torch.bfloat16), "t": torch.randn(4, 5).t(),
             "step": torch.tensor(3.0), "lr": 0.5}
    _save(state, tmp_path)
    used = []
    original = dcp_read.Reader._as_torch
    monkeypatch.setattr(dcp_read.Reader, "_as_torch", lambda self, planner, request, *rest: (
        used.append(request.dest_index.fqn), original(self, planner, request, *rest))[1])
    ours = _load(_blank(state), tmp_path, dcp_read.Reader(tmp_path))
    assert used == ["lr"]  # only the non-tensor value goes through torch's path
    assert all(torch.equal(ours[key], state[key]) for key in ("w", "b", "t", "step")) and ours["lr"] == 0.5


def test_shard_files_are_read_ahead_on_other_threads(tmp_path, monkeypatch):
    import threading

    _save({f"t{index}": torch.randn(500) for index in range(12)}, tmp_path)
    readers, order = set(), []
    real_read, real_fetch, real_one = dcp_read._read, dcp_read.Reader._fetch, dcp_read.Reader._one
    monkeypatch.setattr(dcp_read, "_read", lambda *args: (readers.add(threading.current_thread().name),
                                                           real_read(*args))[1])
    monkeypatch.setattr(dcp_read.Reader, "_fetch", lambda self, *args: (order.append("read"),
                                                                         real_fetch(self, *args))[1])
    monkeypatch.setattr(dcp_read.Reader, "_one", lambda self, *args: (order.append("copy"),
                                                                       real_one(self, *args))[1])
    monkeypatch.setattr(dcp_read, "SPAN_BYTES", 2500)  # a run per item or two
    _load({f"t{index}": torch.zeros(500) for index in range(12)}, tmp_path, dcp_read.Reader(tmp_path))
    assert readers and all(name.startswith("sprite-dcp-read") for name in readers)
    ahead = dcp_read.READ_THREADS
    # READ_THREADS runs started first, and the next one before the first copy
    assert ahead >= 2 and order.index("copy") == ahead + 1
    assert order.count("read") > ahead + 1  # more runs than threads: buffers taken again


class _Touch:
    """Pickled as a call to Path.touch: what a hostile checkpoint would run on load."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        from pathlib import Path

        return Path.touch, (Path(self.path),)


def _replace_item(folder, key: str, payload: bytes) -> None:
    """Put ``payload`` (a torch.save zip) in place of ``key``'s stored bytes, at the end of its file."""
    metadata_path = folder / ".metadata"
    metadata = pickle.loads(metadata_path.read_bytes())
    index = next(index for index in metadata.storage_data if index.fqn == key)
    info = metadata.storage_data[index]
    data_file = folder / info.relative_path
    offset = data_file.stat().st_size
    with open(data_file, "ab") as handle:
        handle.write(payload)
    metadata.storage_data[index] = type(info)(info.relative_path, offset, len(payload))
    metadata_path.write_bytes(pickle.dumps(metadata))


def test_a_stored_pickle_that_calls_anything_else_is_refused(tmp_path):
    import io

    marker = tmp_path / "ran"
    folder = tmp_path / "ckpt"
    _save({"w": torch.randn(4)}, folder)
    hostile = io.BytesIO()
    torch.save(_Touch(str(marker)), hostile)
    _replace_item(folder, "w", hostile.getvalue())
    with pytest.raises(BaseException) as stock:  # torch's CheckpointException is a BaseException
        _load({"w": torch.zeros(4)}, folder)
    with pytest.raises(BaseException) as ours:
        _load({"w": torch.zeros(4)}, folder, dcp_read.Reader(folder))
    assert not marker.exists()
    assert "Unsupported global" in str(ours.value) and "Unsupported global" in str(stock.value)


def test_a_stored_value_that_calls_anything_else_is_refused_where_torch_runs_it(tmp_path):
    first, second = tmp_path / "ran-under-torch", tmp_path / "ran-under-sprite"
    for marker, folder in ((first, tmp_path / "a"), (second, tmp_path / "b")):
        _save({"w": torch.randn(2), "extra": {"x": _Touch(str(marker))}}, folder)
    _load({"w": torch.zeros(2), "extra": {"x": None}}, tmp_path / "a")  # torch's planner: weights_only=False
    assert first.exists()
    with pytest.raises(BaseException) as refused:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp_read.load({"w": torch.zeros(2), "extra": {"x": None}}, tmp_path / "b")
    assert not second.exists() and "Unsupported global" in str(refused.value)


def test_plain_stored_values_load_as_before(tmp_path):
    values = {"lr": 0.25, "betas": (0.9, 0.999), "name": "adamw", "none": None, "flags": [True, False],
              "step": torch.tensor(7.0), "nested": {"eps": 1e-8}}
    _save({"w": torch.arange(3.0), "group": values}, tmp_path)
    state = {"w": torch.zeros(3), "group": {key: type(value)() if not isinstance(value, torch.Tensor) else
                                            torch.zeros(()) for key, value in values.items()}}
    state["group"]["nested"] = {"eps": 0.0}
    state["group"]["none"] = 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_read.load(state, tmp_path)
    assert torch.equal(state["w"], torch.arange(3.0))
    assert {key: value for key, value in state["group"].items() if key != "step"} == \
        {key: value for key, value in values.items() if key != "step"}
    assert torch.equal(state["group"]["step"], values["step"])


def test_a_damaged_stored_zip_fails_as_it_fails_torchs_reader(tmp_path):
    folder = tmp_path / "ckpt"
    _save({"w": torch.randn(64)}, folder)
    _replace_item(folder, "w", b"PK\x03\x04" + b"\x00" * 200)  # no zip directory
    with pytest.raises(BaseException) as stock:
        _load({"w": torch.zeros(64)}, folder)
    with pytest.raises(BaseException) as ours:
        _load({"w": torch.zeros(64)}, folder, dcp_read.Reader(folder))
    assert type(ours.value) is type(stock.value)


def test_the_records_of_another_zip_are_left_to_torch():
    import io
    import zipfile

    raw = memoryview(bytearray(b"PK\x05\x06" + b"\x00" * 16 + b"\x05\x00" + b"hello"))  # a comment after the end
    with pytest.raises(dcp_read._Unknown):
        dcp_read.zip_records(raw)
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data.pkl", b"x" * 1000)  # compressed: its bytes are not the record
        archive.writestr("archive/pad", b"y" * 5000, compress_type=zipfile.ZIP_STORED)
    with pytest.raises(dcp_read._Unknown):
        dcp_read.zip_records(memoryview(bytearray(packed.getvalue())))
    stored = io.BytesIO()
    with zipfile.ZipFile(stored, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", b"x" * 1000)
    where, length = dcp_read.zip_records(memoryview(bytearray(stored.getvalue())))["data.pkl"]
    assert stored.getvalue()[where:where + length] == b"x" * 1000


def test_paused_gc_restores_the_collectors_state():
    from sprite.runtime.ckpt.gcpause import paused_gc

    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()  # a user who turned it off keeps it off
    finally:
        gc.enable()


def test_checkpoint_writes_and_reads_run_without_the_cycle_collector(tmp_path, monkeypatch):
    from sprite.runtime.ckpt import save as hashed_save

    seen = []
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda *args, **kwargs: (seen.append(gc.isenabled()),
                                                                 real_save(*args, **kwargs))[1])
    hashed_save.atomic_save({"w": torch.randn(3)}, tmp_path / "file.ckpt")
    hashed_save.dcp_save({"w": torch.randn(3)}, tmp_path / "folder")
    real_read = dcp_read.Reader.read_data
    monkeypatch.setattr(dcp_read.Reader, "read_data", lambda self, *args: (seen.append(gc.isenabled()),
                                                                           real_read(self, *args))[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_read.load({"w": torch.zeros(3)}, tmp_path / "folder")
    assert seen and not any(seen)  # the file save, the sharded save (its writer's sample archive), the read
    assert gc.isenabled()


def test_install_gives_lightning_sprites_load():
    from lightning.fabric.strategies import fsdp as fabric_fsdp
    from lightning.fabric.strategies import model_parallel
    from lightning.pytorch.strategies import fsdp

    from sprite.runtime.ckpt import seal as ckpt_seal

    ckpt_seal.install()
    assert fabric_fsdp._distributed_checkpoint_load is dcp_read.load
    assert model_parallel._distributed_checkpoint_load is dcp_read.load
    assert fsdp._distributed_checkpoint_load is dcp_read.load


def test_each_rank_plans_its_own_read(tmp_path, monkeypatch):
    import torch.distributed.checkpoint as checkpoint

    _save({"w": torch.arange(4.0)}, tmp_path)
    calls = []
    real = checkpoint.load
    monkeypatch.setattr(checkpoint, "load", lambda *args, **kwargs: (calls.append(kwargs), real(*args, **kwargs))[1])
    state = {"w": torch.zeros(4)}
    dcp_read.load(state, tmp_path)
    assert [call.get("no_dist") for call in calls] == [True] and isinstance(calls[0]["storage_reader"], dcp_read.Reader)
    assert torch.equal(state["w"], torch.arange(4.0))


def _rank(rank: int, world: int, port: int, folder: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    state = {"w": torch.zeros(8)}
    if rank == 1:
        state["missing"] = torch.zeros(2)  # not in the checkpoint: this rank's load fails
    try:
        dcp_read.load(state, folder)
        outcome = ["loaded", state["w"].tolist()]
    except BaseException as error:  # noqa: BLE001 - the test looks at what each rank raised
        outcome = [type(error).__name__, str(error)]
    with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
        json.dump(outcome, handle)
    dist.destroy_process_group()


@pytest.mark.slow
def test_a_rank_that_fails_to_load_fails_every_rank(tmp_path):
    import torch.multiprocessing as mp

    from sprite.launch.rendezvous import free_port

    folder = tmp_path / "ckpt"
    _save({"w": torch.arange(8.0)}, folder)
    mp.start_processes(_rank, args=(2, free_port(), str(folder), str(tmp_path)), nprocs=2, start_method="spawn")
    first, second = (json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2))
    assert second[0] != "loaded" and "missing" in second[1]
    assert first[0] == "RuntimeError" and first[1].startswith("rank 1 could not load the sharded checkpoint")
