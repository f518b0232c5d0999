"""How sprite writes torch.distributed.checkpoint folders (sprite/runtime/ckpt/dcp_write.py, save.dcp_save): torch's
own FileSystemWriter with sprite's options, no archive format of sprite's own; what it writes, torch's reader and
sprite's load equal to the state saved; a save inside a sealed save returns with the state staged in host memory."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import threading
import warnings
import zipfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

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
@given(tensors=st.lists(_tensor(), min_size=1, max_size=6), threads=st.sampled_from([1, 3]))
def test_torchs_reader_and_sprites_load_what_sprites_writer_wrote(tmp_path_factory, tensors, threads):
    state = {f"t{i}": tensor for i, tensor in enumerate(tensors)}
    state["step"], state["groups"] = 7, [{"lr": 0.5, "params": [0, 1]}]
    folder = tmp_path_factory.mktemp("ckpt") / "ckpt"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dcp_write, "threads", lambda: threads)
        hashed_save.dcp_save(state, folder)
    by_torch = _blank(state)
    dcp.load(by_torch, storage_reader=dcp.FileSystemReader(folder), no_dist=True)
    assert _same(by_torch, state)
    by_sprite = _blank(state)
    dcp_read.load(by_sprite, folder)
    assert _same(by_sprite, state)
    again = {key: value.flip(0) if isinstance(value, torch.Tensor) and value.dim() else value
             for key, value in state.items()}  # the same layout, other values: the cached plan serves
    hashed_save.dcp_save(again, folder.with_name("again"))
    by_torch = _blank(again)
    dcp.load(by_torch, storage_reader=dcp.FileSystemReader(folder.with_name("again")), no_dist=True)
    assert _same(by_torch, again)
    torch_folder = tmp_path_factory.mktemp("torch") / "ckpt"
    dcp.save(state, checkpoint_id=torch_folder, no_dist=True)
    mine, theirs = (dcp.FileSystemReader(path).read_metadata() for path in (folder, torch_folder))
    assert mine.state_dict_metadata == theirs.state_dict_metadata


def test_dcp_to_torch_save_converts_what_sprite_wrote(tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    state = {"w": torch.randn(4, 5), "b": torch.arange(3), "step": 3}
    hashed_save.dcp_save(state, tmp_path / "ckpt")
    dcp_to_torch_save(tmp_path / "ckpt", tmp_path / "full.pt")
    assert _same(torch.load(tmp_path / "full.pt", weights_only=True), state)


def _items(folder) -> dict:
    """Each item's archive in the folder's shard files, by name."""
    metadata = dcp.FileSystemReader(folder).read_metadata()
    return {index.fqn: (folder / info.relative_path).read_bytes()[info.offset:info.offset + info.length]
            for index, info in metadata.storage_data.items()}


def test_the_items_are_torch_saves_without_their_crc32(tmp_path, monkeypatch):
    monkeypatch.setattr(dcp_write, "threads", lambda: 1)  # the setting is per thread: torch's further threads keep it
    tensor = torch.randn(3, 5)
    hashed_save.dcp_save({"w": tensor}, tmp_path / "ckpt")
    archive = zipfile.ZipFile(io.BytesIO(_items(tmp_path / "ckpt")["w"]))
    assert {info.CRC for info in archive.infolist()} == {0}  # set_crc32_options(False), inside the save only
    assert torch.serialization.get_crc32_options()
    assert torch.equal(torch.load(io.BytesIO(_items(tmp_path / "ckpt")["w"]), weights_only=True), tensor)


def test_no_crc32_nests_and_restores_torchs_setting():
    before = torch.serialization.get_crc32_options()
    with dcp_write.no_crc32():
        with dcp_write.no_crc32():
            assert not torch.serialization.get_crc32_options()
        assert not torch.serialization.get_crc32_options()
    assert torch.serialization.get_crc32_options() == before


class _FullDisk:
    """A file torch's writer writes into whose writes fail with ENOSPC once ``room`` bytes are in it (a full disk
    simulated: no file system of this machine can be filled by an unprivileged test)."""

    def __init__(self, stream, room: int):
        self.stream, self.room = stream, room

    def write(self, data):
        if self.stream.tell() + len(memoryview(data).cast("B")) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.stream.write(data)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def _disk_full_in(monkeypatch, which, room: int = 600) -> None:
    """sprite's writer gets a file system whose files fill up at ``room`` bytes in the threads ``which`` names."""
    made = dcp_write.writer

    def writer(path):
        made_writer = made(path)
        create = made_writer.fs.create_stream

        @contextlib.contextmanager
        def create_stream(file, mode):
            with create(file, mode) as stream:
                yield _FullDisk(stream, room) if which(threading.current_thread()) else stream

        made_writer.fs.create_stream = create_stream
        return made_writer

    monkeypatch.setattr(dcp_write, "writer", writer)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread's, passed on
def test_a_writing_thread_that_fails_fails_the_save_instead_of_leaving_its_items_out(tmp_path, monkeypatch):
    """torch returns the other threads' results as a success when one of its further writing threads ends with an
    exception, and would record a checkpoint that lacks that thread's items; sprite's writer fails the save."""
    monkeypatch.setattr(dcp_write, "threads", lambda: 2)
    _disk_full_in(monkeypatch, lambda thread: thread is not threading.main_thread())
    state = {f"t{i}": torch.randn(2000) for i in range(4)}
    with pytest.raises(OSError) as caught:
        hashed_save.dcp_save(state, tmp_path / "ckpt")
    message = str(caught.value)
    assert "of 4 items" in message and "No space left on device" in message, message
    assert "\n" not in message and not (tmp_path / "ckpt" / ".metadata").exists()


def test_a_full_disk_inside_an_items_torch_save_is_named_not_the_zip_writers_position(tmp_path, monkeypatch):
    """torch.save, cleaning up after an OSError, raises "unexpected pos N vs M" from its zip writer; sprite's writer
    raises the OSError."""
    monkeypatch.setattr(dcp_write, "threads", lambda: 1)
    _disk_full_in(monkeypatch, lambda thread: True, room=1000)  # the item's zip header fits, its data does not
    with pytest.raises(OSError) as caught:
        hashed_save.dcp_save({"w": torch.randn(200_000)}, tmp_path / "ckpt")
    message = str(caught.value)
    assert "No space left on device" in message and "unexpected pos" not in message, message
    assert message.startswith("torch's writer failed on rank 0: OSError: [Errno 28]"), message
    assert not (tmp_path / "ckpt" / ".metadata").exists()


def test_sprite_writes_no_archive_format_of_its_own():
    import inspect

    source = inspect.getsource(dcp_write)
    assert "struct" not in source and "pickle" not in source.replace("unpickle", "")
    writer = dcp_write.writer("/nonexistent/ckpt")
    assert isinstance(writer, dcp.FileSystemWriter) and not writer.sync_files
    assert writer.thread_count == dcp_write.threads()


def test_the_writer_does_not_fsync(tmp_path, monkeypatch):
    synced, fsync = [], os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), fsync(fd))[1])
    hashed_save.dcp_save({"w": torch.arange(10.0)}, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "__0_0.distcp").exists() and not synced


@pytest.mark.parametrize("kind", ["file", "symlink", "folder-symlink"])
def test_a_folder_that_holds_anything_is_not_written_into(tmp_path, kind):
    folder = tmp_path / "ckpt"
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "__0_0.distcp").write_bytes(b"keep")
    if kind == "folder-symlink":
        folder.symlink_to(theirs)
    else:
        folder.mkdir()
        if kind == "file":
            (folder / "__0_0.distcp").write_bytes(b"keep")
        else:
            (folder / "__0_0.distcp").symlink_to(theirs / "__0_0.distcp")
    with pytest.raises(FileExistsError, match="not empty|symlink"):
        hashed_save.dcp_save({"w": torch.arange(10.0)}, folder)
    assert (theirs / "__0_0.distcp").read_bytes() == b"keep"
    assert not (theirs / ".metadata").exists() and not (tmp_path / "ckpt" / ".metadata").exists()


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


def test_a_background_save_returns_with_the_state_staged_and_writes_it_later(tmp_path, monkeypatch):
    """Inside a sealed save, dcp_save is torch's dcp.async_save: the state is copied before it returns, so the
    training loop may change it at once; the write waits in the Pending the seal runs in the background."""
    gate, written = threading.Event(), []
    real = dcp.FileSystemWriter.write_data

    def held(self, plan, planner):
        assert gate.wait(60)
        written.append(threading.current_thread().name)
        return real(self, plan, planner)

    monkeypatch.setattr(dcp.FileSystemWriter, "write_data", held)
    monkeypatch.setattr(hashed_save, "_stagers", {})
    state = {"w": torch.arange(6.0)}
    with hashed_save.collecting() as pending:
        hashed_save.dcp_save(state, tmp_path / "ckpt")
    assert len(pending) == 1 and not (tmp_path / "ckpt" / ".metadata").exists()
    state["w"].add_(100)  # the next training step
    gate.set()
    assert pending[0].run() == {}
    assert written and written[0] != threading.current_thread().name
    loaded = {"w": torch.zeros(6)}
    dcp.load(loaded, checkpoint_id=tmp_path / "ckpt", no_dist=True)
    assert torch.equal(loaded["w"], torch.arange(6.0))


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_each_save_gets_a_writer_of_its_own_and_each_mode_keeps_one_stager_of_sprites(tmp_path, monkeypatch, mode):
    """Both modes stage with sprite's stager, one per mode kept from save to save (torch 2.11's own cannot stage
    twice in process mode, pytorch/pytorch#183413), shared memory in process mode only; every save gets its own
    writer, which stages nothing itself."""
    import torch.distributed.checkpoint as torch_dcp
    from concurrent.futures import Future

    writers, stagers, done = [], [], Future()
    done.set_result(None)

    def fake_async_save(state, checkpoint_id, storage_writer, process_group, planner, async_checkpointer_type,
                        async_stager):
        writers.append(storage_writer)
        stagers.append(async_stager)
        assert async_checkpointer_type.value == mode
        assert (planner is None) == (mode == "process")  # a planner class made at run time cannot be sent there
        return done

    monkeypatch.setattr(torch_dcp, "async_save", fake_async_save)
    monkeypatch.setenv("SPRITE_CHECKPOINT_WRITER", mode)
    monkeypatch.setattr(dcp_write, "_picked", [])  # this process's first group, room in /dev/shm
    monkeypatch.setattr(dcp_write, "_generation", [0])
    monkeypatch.setattr(dcp_write, "shm_free", lambda: 2**30)
    monkeypatch.setattr(hashed_save, "_stagers", {})
    for name in ("a", "b"):
        hashed_save._async_dcp({"w": torch.arange(3.0)}, tmp_path / name, None)
    assert len({id(writer) for writer in writers}) == 2
    assert not any(writer.cache_staged_state_dict for writer in writers)
    assert stagers[0] is stagers[1] and stagers[0].host.shared == (mode == "process")
    assert hashed_save.stager_of(mode) is stagers[0]


def test_the_writer_is_the_one_sprite_run_chose_and_a_wrong_one_is_refused_in_one_line(tmp_path, monkeypatch):
    """``sprite run --checkpoint-writer`` (or the spec's ``checkpoint_writer:``) reaches the ranks as
    SPRITE_CHECKPOINT_WRITER, which picks torch's async checkpointer before any save; a value sprite did not write is
    refused naming itself."""
    import json
    import subprocess
    import sys

    from sprite.errors import UsageError

    monkeypatch.setattr(dcp_write, "_picked", [])
    assert dcp_write.mode({"SPRITE_CHECKPOINT_WRITER": "process"}) == "process"
    assert dcp_write.mode({}) == "thread"
    with pytest.raises(UsageError, match="SPRITE_CHECKPOINT_WRITER='fork' is not a checkpoint writer") as err:
        dcp_write.mode({"SPRITE_CHECKPOINT_WRITER": "fork"})
    assert "thread, process" in err.value.fix
    script = tmp_path / "t.py"
    script.write_text("")
    (tmp_path / "job.yaml").write_text(f"script: {script}\ncheckpoint_writer: process\n")

    def planned(*flags):
        return subprocess.run([sys.executable, "-m", "sprite", "run", "--dry-run", "--json", *flags],
                              capture_output=True, text=True, cwd=tmp_path, check=False)

    for flags in (["--checkpoint-writer", "process", str(script)], ["--spec", "job.yaml"]):
        assert json.loads(planned(*flags).stdout)["env"]["SPRITE_CHECKPOINT_WRITER"] == "process", flags
    assert "SPRITE_CHECKPOINT_WRITER" not in json.loads(planned(str(script)).stdout)["env"]
    wrong = planned("--checkpoint-writer", "fork", str(script))
    assert wrong.returncode == 2 and "--checkpoint-writer" in wrong.stderr and "thread, process" in wrong.stderr
    assert wrong.stderr.count("\n") == 1, wrong.stderr


def test_saves_that_plan_alike_reuse_the_plan_and_each_loads_equal(tmp_path, monkeypatch):
    """Plan caching (dcp_write.planner): a save whose layout equals the one before sends no plan; one whose layout
    changed plans afresh; every folder loads equal to what was saved, by torch's reader and sprite's."""
    from torch.distributed.checkpoint import DefaultSavePlanner

    usable = []
    real = DefaultSavePlanner.create_local_plan

    def spy(self):
        plan = real(self)
        usable.append(plan.usable)
        return plan

    monkeypatch.setattr(DefaultSavePlanner, "create_local_plan", spy)
    monkeypatch.setattr(hashed_save, "_stagers", {})
    dcp_write.new_group()  # no plan of another test's saves
    first = {"w": torch.randn(4, 5), "b": torch.arange(3)}
    states = [first, {"w": torch.randn(4, 5), "b": torch.arange(3) + 7},
              {"w": torch.randn(2, 2), "b": torch.arange(3), "extra": torch.ones(6)}, first]
    for number, state in enumerate(states):
        folder = tmp_path / f"ckpt{number}"
        if number % 2:  # in the background, as inside a sealed save
            with hashed_save.collecting() as pending:
                hashed_save.dcp_save(state, folder)
            pending[0].run()
        else:
            hashed_save.dcp_save(state, folder)
        by_torch, by_sprite = _blank(state), _blank(state)
        dcp.load(by_torch, storage_reader=dcp.FileSystemReader(folder), no_dist=True)
        dcp_read.load(by_sprite, folder)
        assert _same(by_torch, state) and _same(by_sprite, state), number
    assert usable == [True, False, True, False]  # the last layout is the first's: its cached plan serves


def test_each_process_group_and_each_layout_plans_under_a_cache_key_of_its_own():
    state = {"w": torch.zeros(3), "opt": [{"m": torch.zeros(2)}]}
    dcp_write.new_group()
    one = type(dcp_write.planner(state))
    assert type(dcp_write.planner({"w": torch.ones(3), "opt": [{"m": torch.ones(2)}]})) is one
    for changed in ({"w": torch.zeros(3, dtype=torch.float16), "opt": [{"m": torch.zeros(2)}]},
                    {"w": torch.zeros(3), "opt": [{"m": torch.zeros(2, dtype=torch.int64)}]},
                    {"w": torch.zeros(3, requires_grad=True), "opt": [{"m": torch.zeros(2)}]},
                    {"w": torch.zeros(3), "opt": [{"m": torch.zeros(2)}], "more": torch.zeros(1)}):
        assert type(dcp_write.planner(changed)).__name__ != one.__name__, changed
        assert type(dcp_write.planner(state)).__name__ == one.__name__
    hashed_save.forget()  # a warm pool's next role
    assert type(dcp_write.planner(state)).__name__ != one.__name__


def test_a_dtype_that_changed_between_saves_is_recorded_as_it_is_now(tmp_path, monkeypatch):
    """torch's plan cache alone compares no dtype: the second save would carry the first one's metadata."""
    monkeypatch.setattr(hashed_save, "_stagers", {})
    dcp_write.new_group()
    for number, dtype in enumerate((torch.float32, torch.float16)):
        state = {"w": torch.arange(4, dtype=dtype)}
        hashed_save.dcp_save(state, tmp_path / f"ckpt{number}")
        metadata = dcp.FileSystemReader(tmp_path / f"ckpt{number}").read_metadata()
        assert metadata.state_dict_metadata["w"].properties.dtype == dtype
        by_torch = _blank(state)
        dcp.load(by_torch, storage_reader=dcp.FileSystemReader(tmp_path / f"ckpt{number}"), no_dist=True)
        assert _same(by_torch, state)


_ON_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on the H200s)")


@pytest.mark.parametrize("mode, device", [("process", "cpu"), ("thread", "cpu"),
                                          pytest.param("process", "cuda", marks=_ON_CUDA),
                                          pytest.param("thread", "cuda", marks=_ON_CUDA)])
def test_sprites_stager_saves_again_and_again_reusing_its_buffers_while_steps_go_on(tmp_path, mode, device):
    """torch 2.11's own stager cannot stage twice in process mode (pytorch/pytorch#183413); sprite's (stage.stager)
    keeps its buffers, DTensors included, and every save loads equal to the state at the save call although steps
    change it in place at once. On CUDA the copies are queued on a stream of their own (stage.fence orders the
    steps after them)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent / "scripts" / "background_dcp_save.py"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    done = subprocess.run([sys.executable, str(script), str(tmp_path), mode, device], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    saves = json.loads((tmp_path / "result.json").read_text())
    assert [save["equal"] for save in saves] == [True, True, True] and saves[0]["keys"] >= 12
    assert saves[0]["dtensors"] >= 6  # the model's and the optimizer's sharded tensors
    assert saves[0]["addresses"] == saves[1]["addresses"] == saves[2]["addresses"]
    # process mode: every buffer is a view of one block of shared memory, sent to torch's process as one descriptor
    assert [save["blocks"] for save in saves] == ([1, 1, 1] if mode == "process" else [saves[0]["keys"]] * 3)


GiB = 2**30


def test_unset_the_writer_is_process_on_cuda_with_room_in_dev_shm_else_thread_with_a_line_where_room_lacked():
    """The default (dcp_write.default_mode): torch's checkpoint process for a CUDA state where /dev/shm holds every
    local rank's buffers with a quarter spare; a thread for a CPU or XPU state, without a word; a thread where the
    room lacks (or there is no /dev/shm), with one line that says what lacked and the two ways out."""
    assert dcp_write.default_mode({"cuda", "cpu"}, GiB, 4, 5 * GiB) == ("process", "")
    assert dcp_write.default_mode({"cpu"}, GiB, 1, 100 * GiB) == ("thread", "")
    assert dcp_write.default_mode({"xpu", "cpu"}, GiB, 12, 100 * GiB) == ("thread", "")
    assert dcp_write.default_mode({"cuda"}, GiB, 4, 5 * GiB)[0] == "process"  # 4 ranks x 1 GiB x 1.25
    assert dcp_write.default_mode({"cuda"}, GiB, 4, 5 * GiB - 1)[0] == "thread"  # a byte short is short
    for free in (4 * GiB, None):
        pick, why = dcp_write.default_mode({"cuda"}, GiB, 4, free)
        assert pick == "thread" and "\n" not in why and len(why) < 400, why
        assert ("4.0 GiB free in /dev/shm" if free else "no /dev/shm") in why
        assert "need 5.0 GiB" in why and "4 rank(s) x 1.0 GiB" in why
        assert "larger /dev/shm" in why and "--checkpoint-writer thread" in why


def test_torchs_checkpoint_processes_join_the_runs_store_where_master_addr_and_port_name_it():
    """dcp_write.prefix_store: torch's DCP_USE_PREFIX_STORE=1 where MASTER_ADDR and a numeric MASTER_PORT are set
    (torch asserts on both), nothing without them, and a value the user set stays."""
    from sprite.runtime.ckpt.torch_names import DCP_PREFIX_STORE

    env = {"MASTER_ADDR": "node1", "MASTER_PORT": "29500"}
    dcp_write.prefix_store(env)
    assert env[DCP_PREFIX_STORE] == "1"
    for env in ({"MASTER_PORT": "29500"}, {"MASTER_ADDR": "node1"}, {"MASTER_ADDR": "node1", "MASTER_PORT": "x"}):
        dcp_write.prefix_store(env)
        assert DCP_PREFIX_STORE not in env, env
    env = {"MASTER_ADDR": "node1", "MASTER_PORT": "29500", DCP_PREFIX_STORE: "0"}
    dcp_write.prefix_store(env)
    assert env[DCP_PREFIX_STORE] == "0"


def test_the_pick_is_made_once_a_process_group_from_the_state_and_made_again_for_the_next_group(monkeypatch, capsys):
    """mode() picks at the first save of a process group (a CPU state here: thread, no line), keeps that pick for
    later saves whatever their state, and forgets it with the group (new_group); before any save it says thread
    and remembers nothing. A pick that fell back for room prints its line once, to stderr. A later group of the same
    process (a warm pool's next role) takes thread: torch's one checkpoint process is joined to the first group."""
    monkeypatch.setattr(dcp_write, "_picked", [])
    monkeypatch.setattr(dcp_write, "_generation", [0])
    assert dcp_write.mode({}) == "thread" and dcp_write._picked == []
    assert dcp_write.mode({}, state={"w": torch.zeros(3)}) == "thread" and dcp_write._picked == ["thread"]
    monkeypatch.setattr(dcp_write, "default_mode", lambda *args: ("process", ""))
    assert dcp_write.mode({}, state={"w": torch.zeros(3)}) == "thread"  # kept for the group
    dcp_write._picked.clear()  # the same group's pick made again: now process
    assert dcp_write.mode({}, state={"w": torch.zeros(3)}) == "process"
    dcp_write.new_group()
    assert dcp_write.mode({}, state={"w": torch.zeros(3)}) == "thread"  # the next group of this process
    seen = []
    monkeypatch.setattr(dcp_write, "default_mode", lambda *args: seen.append(args) or ("thread", "no room here"))
    monkeypatch.setattr(dcp_write, "_generation", [0])  # a first group again
    monkeypatch.setattr(dcp_write, "shm_free", lambda: 7 << 30)  # /dev/shm's room, which other tests change
    dcp_write._picked.clear()
    for _ in range(2):
        assert dcp_write.mode({"LOCAL_WORLD_SIZE": "3"}, state={"a": torch.zeros(4), "b": [torch.zeros(2, 2)]}) \
            == "thread"
    assert capsys.readouterr().err == "sprite: no room here\n"
    assert seen == [({"cpu"}, 32, 3, 7 << 30, "")]  # 8 floats of 4 bytes, 3 ranks on the node, the room


def test_a_chosen_process_writer_needs_the_room_and_a_first_group_else_a_thread_says_why(monkeypatch, capsys):
    """--checkpoint-writer process is taken for any state with room in /dev/shm (a CPU one here); without the room
    (torch's process would stage past tmpfs's capacity: SIGBUS) or in a warm pool's later role (torch's one process
    is joined to the first world) the saves are written in a thread, with one line saying why; a chosen thread is
    taken outright, with nothing walked or said."""
    state = {"w": torch.zeros(256)}
    chosen = {"SPRITE_CHECKPOINT_WRITER": "process"}

    def first_save(env, free):
        monkeypatch.setattr(dcp_write, "_picked", [])
        monkeypatch.setattr(dcp_write, "_generation", [0])
        monkeypatch.setattr(dcp_write, "shm_free", lambda: free)
        return dcp_write.mode(env, state=state)

    assert first_save(chosen, GiB) == "process" and capsys.readouterr().err == ""
    assert dcp_write.mode(chosen) == "process"  # what the seal records, the pick kept
    assert dcp_write.default_mode({"cpu"}, GiB, 4, 5 * GiB - 1, "process")[0] == "thread"  # a byte short is short
    assert first_save(chosen, 1024) == "thread"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--checkpoint-writer process is not taken" in err and "free in /dev/shm" in err
    assert dcp_write.mode(chosen) == "thread"
    monkeypatch.setattr(dcp_write, "shm_free", lambda: GiB)
    dcp_write.new_group()  # a warm pool's next role
    assert dcp_write.mode(chosen, state=state) == "thread"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "later role" in err and "--checkpoint-writer process is not taken" in err
    monkeypatch.setattr(dcp_write, "_leaves", lambda *args: pytest.fail("a chosen thread walked the state"))
    assert first_save({"SPRITE_CHECKPOINT_WRITER": "thread"}, 0) == "thread" and capsys.readouterr().err == ""


def _vote(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from sprite.runtime.ckpt import dcp_write

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    picks = [dcp_write.agree(pick, dist.group.WORLD) for pick in (["process", "thread"][rank], "process")]
    with open(os.path.join(out, f"rank{rank}.txt"), "w") as handle:
        handle.write(" ".join(picks))
    dist.destroy_process_group()


@pytest.mark.slow
def test_every_rank_takes_process_mode_only_where_every_rank_picked_it(tmp_path):
    """Two real gloo ranks: one lacking room (thread) makes both write in a thread, as the modes plan on different
    process groups and ranks that differed would hang; both picking process keep it."""
    import torch.multiprocessing as mp

    from sprite.launch.rendezvous import free_port

    mp.start_processes(_vote, args=(2, free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    assert [(tmp_path / f"rank{rank}.txt").read_text() for rank in range(2)] == ["thread process"] * 2


def test_each_rank_writes_as_many_files_at_once_as_its_share_of_the_cores_allows(monkeypatch):
    """dcp_write.threads: the cores a rank is bound to, or its node's cores divided among its ranks, at most
    MAX_THREADS (sprite.integrity.digest.rank_cores, shared with the hashing)."""
    from sprite.integrity import digest

    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(digest, "cgroup_cpus", lambda: None)  # this machine's own cgroup has no say here
    for local, want in (("1", dcp_write.MAX_THREADS), ("8", 2), ("16", 1), ("32", 1)):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
        assert dcp_write.threads() == want, local
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 4})  # bound to two cores of its own
    assert dcp_write.threads() == 2
    monkeypatch.setattr(dcp_write, "shm_free", lambda: 9 << 20)  # room for one rank's 4 MiB with a quarter spare,
    monkeypatch.setattr(dcp_write, "_generation", [0])
    state = {"w": torch.zeros(1 << 20)}  # not for two
    for local, want in (("1", "process"), ("2", "thread"), ("two", "process")):  # "two": not sprite's, one rank
        monkeypatch.setattr(dcp_write, "_picked", [])
        assert dcp_write.mode({"LOCAL_WORLD_SIZE": local, "SPRITE_CHECKPOINT_WRITER": "process"}, state=state) \
            == want, local


def test_a_writer_unpickled_in_torchs_checkpoint_process_drops_only_that_modules_info_lines(tmp_path):
    """What torch's checkpoint process does with the writer each save sends it: unpickle it. From then on that
    process's root logger drops its per-save INFO lines and passes everything else (dcp_write.quiet_checkpoint_process);
    a writer that stays in the rank (thread mode) adds no filter."""
    import logging
    import pickle

    from sprite.runtime.ckpt.torch_names import DCP_PROCESS_MODULE

    root = logging.getLogger()
    before = list(root.filters)
    try:
        sent = dcp_write.writer(tmp_path / "save")
        assert root.filters == before
        got = pickle.loads(pickle.dumps(sent))
        assert isinstance(got, dcp_write.Writer) and got.thread_count == sent.thread_count
        pickle.loads(pickle.dumps(sent))  # a second save adds no second filter
        added = [kept for kept in root.filters if kept not in before]
        assert len(added) == 1
        torchs = os.path.join(os.path.dirname(dcp.__file__), DCP_PROCESS_MODULE.rsplit(".", 1)[1] + ".py")

        def passes(path: str, level: int) -> bool:
            return bool(root.filter(logging.LogRecord("root", level, path, 1, "a line", None, None)))

        assert not passes(torchs, logging.INFO) and not passes(torchs, logging.DEBUG)
        assert passes(torchs, logging.WARNING) and passes(torchs, logging.ERROR)
        assert passes(__file__, logging.INFO) and passes(dcp_write.__file__, logging.INFO)
    finally:
        for kept in list(root.filters):
            if kept not in before:
                root.removeFilter(kept)
