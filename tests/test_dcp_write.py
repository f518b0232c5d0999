"""sprite's writer of torch.distributed.checkpoint folders (sprite/runtime/ckpt/dcp_write.py): what it writes, torch's
own reader loads (and sprite's); each plain tensor is the archive torch.save writes, without a torch.save call;
the one shard file a rank is created new, hashed while written, removed when the save fails."""

from __future__ import annotations

import io
import os
import warnings
import zipfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from sprite.integrity import digest
from sprite.runtime.ckpt import dcp_read
from sprite.runtime.ckpt import dcp_write
from sprite.runtime.ckpt import save as hashed_save

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.int8,
          torch.uint8, torch.bool, torch.complex64, torch.uint16]  # uint16: no storage name, so torch.save's


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        yield


def _blank(state: dict) -> dict:
    return {key: torch.zeros(value.shape, dtype=value.dtype) if isinstance(value, torch.Tensor) else value
            for key, value in state.items()}


def _same(loaded: dict, state: dict) -> bool:
    return all(torch.equal(loaded[key], value) if isinstance(value, torch.Tensor) else loaded[key] == value
               for key, value in state.items())


@st.composite
def _tensor(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(0, 9), min_size=0, max_size=3))
    base = (torch.rand(shape, generator=torch.Generator().manual_seed(draw(st.integers(0, 2 ** 16)))) * 200
            - 100).to(dtype)
    layout = draw(st.sampled_from(["plain", "transposed", "strided", "narrowed"]))
    if layout == "transposed" and base.dim() >= 2:
        return base.transpose(0, 1)
    if layout == "strided" and base.dim() >= 1:
        return base[::2]
    if layout == "narrowed" and base.dim() >= 1 and base.shape[0] > 1:
        return base[1:]
    return base


@settings(max_examples=25, deadline=None)
@given(tensors=st.lists(_tensor(), min_size=1, max_size=6), small=st.sampled_from([1, 64, 1 << 20]),
       batch=st.sampled_from([1, 1 << 26]))
def test_torchs_reader_and_sprites_load_what_sprites_writer_wrote(tmp_path_factory, tensors, small, batch):
    state = {f"t{i}": tensor for i, tensor in enumerate(tensors)}
    state["step"], state["groups"] = 7, [{"lr": 0.5, "params": [0, 1]}]
    folder = tmp_path_factory.mktemp("ckpt") / "ckpt"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dcp_write, "_SMALL", small)  # pieces written one by one, or gathered
        patch.setattr(dcp_write, "BATCH_BYTES", batch)  # a batch an item, or one for all
        hashed_save.dcp_save(state, folder)
    by_torch = _blank(state)
    dcp.load(by_torch, storage_reader=dcp.FileSystemReader(folder), no_dist=True)
    assert _same(by_torch, state)
    by_sprite = _blank(state)
    dcp_read.load(by_sprite, folder)
    assert _same(by_sprite, state)
    torch_folder = tmp_path_factory.mktemp("torch") / "ckpt"
    dcp.save(state, checkpoint_id=torch_folder, no_dist=True)
    mine, theirs = (dcp.FileSystemReader(path).read_metadata() for path in (folder, torch_folder))
    assert mine.state_dict_metadata == theirs.state_dict_metadata


def _items(folder) -> dict:
    """Each item's archive in the folder's shard file, by name."""
    metadata = dcp.FileSystemReader(folder).read_metadata()
    data = (folder / "__0_0.distcp").read_bytes()
    return {index.fqn: data[info.offset:info.offset + info.length] for index, info in metadata.storage_data.items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex128])
def test_each_plain_tensor_is_the_archive_torch_save_writes_but_its_crc(tmp_path, dtype):
    tensor = (torch.randn(3, 5) * 10).to(dtype).t()  # stored in row-major order, as a copy would be
    hashed_save.dcp_save({"w": tensor}, tmp_path / "ckpt")
    archive = _items(tmp_path / "ckpt")["w"]
    expected = io.BytesIO()
    torch.save(tensor.contiguous(), expected)
    mine, theirs = zipfile.ZipFile(io.BytesIO(archive)), zipfile.ZipFile(expected)
    assert [info.filename for info in mine.infolist()] == [info.filename for info in theirs.infolist()]
    records = dcp_read.zip_records(memoryview(archive))  # read without the CRC check zipfile makes
    for name, (start, length) in records.items():
        if name != ".data/serialization_id":
            assert archive[start:start + length] == theirs.read(f"archive/{name}"), name
    assert {info.CRC for info in mine.infolist()} == {0}
    from torch.utils.serialization import config

    config.save.compute_crc32 = False
    try:  # as torch.save writes them with its CRC turned off
        unchecked = io.BytesIO()
        torch.save(tensor.contiguous(), unchecked)
    finally:
        config.save.compute_crc32 = True
    assert {info.CRC for info in zipfile.ZipFile(unchecked).infolist()} == {0}
    assert records["data/0"][0] % 64 == 0  # aligned in its archive, as torch.save aligns it
    assert torch.equal(torch.load(io.BytesIO(archive), weights_only=True), tensor)


def test_plain_tensors_are_written_without_torch_save(tmp_path, monkeypatch):
    calls = []
    real = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, *args, **kwargs: (calls.append(obj), real(obj, *args,
                                                                                           **kwargs))[1])
    state = {f"w{i}": torch.randn(4, 4) for i in range(10)}
    state["odd"] = torch.zeros(3, dtype=torch.uint16)  # no storage name: torch.save writes it
    hashed_save.dcp_save(state, tmp_path / "ckpt")
    tensors = [obj for obj in calls if isinstance(obj, torch.Tensor)]
    assert len(tensors) == 2 and tensors[-1].dtype == torch.uint16  # the sample archive, then the odd one
    loaded = _blank(state)
    dcp.load(loaded, checkpoint_id=tmp_path / "ckpt", no_dist=True)
    assert _same(loaded, state)


def test_a_torch_whose_pickle_differs_gets_every_tensor_through_torch_save(tmp_path, monkeypatch):
    real = dcp_write._data_pkl
    monkeypatch.setattr(dcp_write, "_data_pkl", lambda *args: real(*args) + b"!")
    assert not dcp_write._Format().usable
    calls = []
    save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, *args, **kwargs: (calls.append(obj), save(obj, *args, **kwargs))[1])
    state = {"a": torch.randn(5), "b": torch.arange(6).reshape(2, 3)}
    hashed_save.dcp_save(state, tmp_path / "ckpt")
    assert len([obj for obj in calls if isinstance(obj, torch.Tensor)]) == 3  # the sample, then both
    loaded = _blank(state)
    dcp.load(loaded, checkpoint_id=tmp_path / "ckpt", no_dist=True)
    assert _same(loaded, state)


def test_an_archive_past_the_plain_zips_limit_is_left_to_torch_save(tmp_path, monkeypatch):
    with pytest.raises(OverflowError):
        dcp_write._zip([("archive/data.pkl", b"x"), ("archive/data/0", 1 << 32)])
    monkeypatch.setattr(dcp_write, "_LIMIT", 1000)  # every archive of a tensor over about 1000 bytes
    state = {"big": torch.randn(1000), "small": torch.randn(3)}
    hashed_save.dcp_save(state, tmp_path / "ckpt")
    archives = _items(tmp_path / "ckpt")
    assert zipfile.ZipFile(io.BytesIO(archives["big"])).getinfo("archive/data/0").CRC != 0  # torch.save's
    assert zipfile.ZipFile(io.BytesIO(archives["small"])).getinfo("archive/data/0").CRC == 0  # sprite's
    loaded = _blank(state)
    dcp.load(loaded, checkpoint_id=tmp_path / "ckpt", no_dist=True)
    assert _same(loaded, state)


def test_the_shard_file_is_hashed_while_written_and_not_read_again_by_the_seal(tmp_path, monkeypatch):
    from sprite import integrity
    from sprite.runtime.ckpt import seal as ckpt_seal

    monkeypatch.setattr(digest, "CHUNK", 4096)  # many pieces in a small file
    monkeypatch.setattr(dcp_write, "_SMALL", 1000)
    during, growing = [], []
    real_written = digest.Growing.written
    monkeypatch.setattr(digest.Growing, "written", lambda self, size: (during.append(size), growing.append(self),
                                                                       real_written(self, size))[1])
    folder = tmp_path / "ckpt"
    hashed_save.dcp_save({"w": torch.randn(20000), "b": torch.randn(3000)}, folder)
    shard = folder / "__0_0.distcp"
    assert sorted(path.name for path in folder.iterdir()) == [".metadata", shard.name]
    assert len(set(during)) > 3 and growing[0].jobs[0].done()  # pieces hashed as the file grew
    assert hashed_save.known_entry(shard) == digest.files([shard])[0]
    assert not hashed_save.fsync_seen_to(shard)  # the seal fsyncs it
    described = []
    real_describe = integrity.describe
    monkeypatch.setattr(integrity, "describe", lambda root, names: (described.extend(names),
                                                                    real_describe(root, names))[1])
    ok, files, later = ckpt_seal.describe_mine(folder, 0, 1, sync=False)
    assert ok and shard.name not in described  # not read again
    assert str(shard) in later  # but fsynced in the background
    assert files[shard.name] == digest.files([shard])[0]


def test_the_writer_does_not_fsync(tmp_path, monkeypatch):
    synced, fsync = [], os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), fsync(fd))[1])
    hashed_save.dcp_save({"w": torch.arange(10.0)}, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "__0_0.distcp").exists() and not synced


@pytest.mark.parametrize("kind", ["file", "symlink"])
def test_a_shard_file_that_exists_is_not_written_over(tmp_path, kind):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    theirs = tmp_path / "theirs"
    theirs.write_bytes(b"keep")
    if kind == "file":
        (folder / "__0_0.distcp").write_bytes(b"keep")
    else:
        (folder / "__0_0.distcp").symlink_to(theirs)
    with pytest.raises(BaseException) as caught:  # torch's CheckpointException is a BaseException
        hashed_save.dcp_save({"w": torch.arange(10.0)}, folder)
    assert "already exists" in str(caught.value)
    assert theirs.read_bytes() == b"keep"
    assert os.path.lexists(folder / "__0_0.distcp") and (kind == "symlink" or
                                                         (folder / "__0_0.distcp").read_bytes() == b"keep")
    assert not (folder / ".metadata").exists()


def test_a_save_that_fails_midway_leaves_no_shard_file(tmp_path, monkeypatch):
    monkeypatch.setattr(dcp_write, "BATCH_BYTES", 1)  # a batch an item: the first is written before the failure
    real = dcp_write._bytes
    seen = []

    def failing(tensor):
        seen.append(tensor)
        if len(seen) == 3:
            raise OSError(28, "No space left on device")
        return real(tensor)

    monkeypatch.setattr(dcp_write, "_bytes", failing)
    folder = tmp_path / "ckpt"
    with pytest.raises(BaseException, match="No space left"):
        hashed_save.dcp_save({f"w{i}": torch.randn(100) for i in range(5)}, folder)
    assert not (folder / "__0_0.distcp").exists() and not (folder / ".metadata").exists()


def test_torch_load_does_not_check_the_crc_that_sprites_writer_leaves_out():
    """Why the CRC-32 is not worth its time: torch.load reads a tensor whose data no longer matches it."""
    tensor = torch.arange(1000, dtype=torch.float32)
    out = io.BytesIO()
    torch.save(tensor, out)
    raw = bytearray(out.getvalue())
    at = raw.find(tensor.numpy().tobytes()[400:416])
    raw[at] ^= 1
    loaded = torch.load(io.BytesIO(bytes(raw)), weights_only=True)
    assert not torch.equal(loaded, tensor) and torch.equal(loaded[:100], tensor[:100])


def test_each_batch_is_written_on_another_thread_while_the_next_is_prepared(tmp_path, monkeypatch):
    import threading

    monkeypatch.setattr(dcp_write, "BATCH_BYTES", 1)  # a batch an item
    writers, preparers = [], []
    real_put, real_host = dcp_write._Sink.put, dcp_write.Writer._host
    monkeypatch.setattr(dcp_write._Sink, "put", lambda self, parts: (writers.append(threading.current_thread().name),
                                                                      real_put(self, parts))[1])
    monkeypatch.setattr(dcp_write.Writer, "_host", staticmethod(lambda *args: (
        preparers.append(threading.current_thread().name), real_host(*args))[1]))
    state = {f"w{i}": torch.randn(50) for i in range(4)}
    hashed_save.dcp_save(state, tmp_path / "ckpt")
    assert len(preparers) == 4 and set(preparers) == {threading.current_thread().name}
    assert len(writers) == 5 and all(name.startswith("sprite-dcp-write") for name in writers)  # and the last, empty
