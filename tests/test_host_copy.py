"""sprite.runtime.ckpt.stage: the copy of a checkpoint's state off the device, waited for or queued.

The queued path needs a device (its tests run on the H200s; here they are skipped); on CPU a queued copy is
complete on return, which the tests here check, with the fence every save ends with.
"""

from __future__ import annotations

import pytest
import torch

from sprite.runtime.ckpt import save as hashed_save
from sprite.runtime.ckpt import stage

ON_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on the H200s)")


def test_a_copy_shares_nothing_with_the_state_and_reuses_its_buffers():
    state = {"w": torch.arange(4.0), "nested": [torch.ones(2), (torch.zeros(3), "text")], "n": 3}
    host = stage.HostCopy()
    first = host.copy(state)
    state["w"].add_(1)
    assert torch.equal(first["w"], torch.arange(4.0)) and first["nested"][1][1] == "text" and first["n"] == 3
    second = host.copy(state)
    assert second["w"].data_ptr() == first["w"].data_ptr()  # the buffer is kept from save to save
    assert torch.equal(second["w"], torch.arange(4.0) + 1)


def test_on_cpu_a_queued_copy_is_complete_on_return_and_its_ticket_waits_for_nothing():
    state = {"w": torch.arange(4.0)}
    copied, ticket = stage.HostCopy().queue(state)
    state["w"].mul_(0)
    ticket.wait()
    assert ticket.events == [] and torch.equal(copied["w"], torch.arange(4.0))


def test_copies_from_an_accelerator_other_than_cuda_are_waited_for_not_queued(monkeypatch):
    """Queued copies were tested on CUDA only, so from any other accelerator (XPU) a save waits for its copies.
    A fake: the CPU stands in for an XPU here (stage._accelerated says yes to it), as no XPU runs on this machine."""
    waited = []
    monkeypatch.setattr(stage, "_accelerated", lambda device: True)
    monkeypatch.setattr(torch.cpu, "synchronize", lambda device=None: waited.append(device))
    state = {"w": torch.arange(4.0)}
    copied, ticket = stage.HostCopy().queue(state)
    state["w"].mul_(0)
    assert ticket.events == [] and waited == [torch.device("cpu")]
    assert torch.equal(copied["w"], torch.arange(4.0))


def test_every_save_ends_with_the_fence_that_orders_later_kernels_after_its_copies(monkeypatch):
    fenced = []
    monkeypatch.setattr(stage, "fence", lambda: fenced.append(True))
    with hashed_save.collecting():
        assert not fenced
    assert fenced == [True]
    with pytest.raises(RuntimeError), hashed_save.collecting():
        raise RuntimeError("a save that failed still fences what it queued")
    assert fenced == [True, True]


def _big(n: int = 1 << 26) -> torch.Tensor:  # 256 MB of float32: its copy takes milliseconds on an H200
    return torch.randn(n, device="cuda")


@ON_CUDA
@pytest.mark.parametrize("shared", [False, True])
def test_queued_copies_hold_the_values_at_the_save_while_later_kernels_change_them(shared):
    source = _big()
    want = source.cpu()
    host = stage.HostCopy(shared=shared)
    copied, ticket = host.queue({"w": source})
    stage.fence()
    for _ in range(5):  # in place, on the loop's stream, queued at once
        source.mul_(-1.5)
    ticket.wait()
    assert torch.equal(copied["w"], want)
    host.release()


@ON_CUDA
def test_a_queued_copy_returns_before_the_device_has_copied():
    """The point of queueing: the host goes on while the device copies (a 1 GiB copy still running at return)."""
    source = torch.randn(1 << 28, device="cuda")
    torch.cuda.synchronize()
    host = stage.HostCopy()
    host.copy({"w": source})  # the pinned buffer is made now, not inside the queued copy below
    copied, ticket = host.queue({"w": source})
    assert not all(event.query() for event in ticket.events)
    stage.fence()
    ticket.wait()
    assert torch.equal(copied["w"], source.cpu())


@ON_CUDA
def test_a_source_freed_before_its_queued_copy_ran_is_not_reused_meanwhile():
    """record_stream: the allocator keeps a freed source's memory until the side stream's copy of it is done."""
    source = _big()
    want = source.cpu()
    host = stage.HostCopy()
    host.copy({"w": source})
    copied, ticket = host.queue({"w": source})
    address = source.data_ptr()
    del source
    other = torch.full((1 << 26,), 7.0, device="cuda")  # no fence yet: the loop's stream runs ahead
    assert other.data_ptr() != address or ticket.events[0].query()
    stage.fence()
    ticket.wait()
    assert torch.equal(copied["w"], want)


def test_shared_buffers_are_views_of_one_block_laid_out_again_when_a_shape_changes():
    """Process mode's buffers (shared): one block of shared memory holds every buffer, each at its own aligned
    place; the next save of the same shapes reuses them; a changed shape lays every buffer out in a new block. A
    Parameter is staged as its plain tensor, a sparse tensor is copied its own way (no buffer)."""
    weight = torch.nn.Parameter(torch.randn(3, 5))
    state = {"w": weight, "more": [torch.tensor(2.5), (torch.arange(7, dtype=torch.int16), "text")],
             "sparse": torch.eye(3).to_sparse(), "none": torch.empty(0, 4)}
    host = stage.HostCopy(shared=True)
    first = host.copy(state)
    assert torch.equal(first["w"], weight) and first["more"][0] == 2.5 and first["more"][1][1] == "text"
    assert torch.equal(first["more"][1][0], torch.arange(7, dtype=torch.int16)) and first["sparse"].is_sparse
    block = {buffer.untyped_storage().data_ptr() for buffer in host.buffers}
    assert len(host.buffers) == 4 and len(block) == 1 and host.buffers[0].is_shared()
    assert all(buffer.data_ptr() % stage.ALIGN == 0 for buffer in host.buffers if buffer.numel())
    weight.data.add_(1)
    again = host.copy(state)
    assert [b.data_ptr() for b in again.values() if isinstance(b, torch.Tensor) and not b.is_sparse] == \
        [first["w"].data_ptr(), first["none"].data_ptr()] and torch.equal(again["w"], weight)
    state["none"] = torch.ones(2, 4)
    moved = host.copy(state)
    assert torch.equal(moved["none"], torch.ones(2, 4)) and torch.equal(moved["w"], weight)
    assert len({buffer.untyped_storage().data_ptr() for buffer in host.buffers}) == 1
    assert moved["w"].untyped_storage().data_ptr() not in block  # every buffer moved to the new block


def test_a_block_that_dev_shm_lacks_room_for_is_refused_in_one_line_before_anything_is_copied(monkeypatch):
    """Shared memory written past /dev/shm's room kills the rank with SIGBUS. A state that grew since the first save
    (a buffer made mid-fit) needs a larger block while torch's process still holds the old
    one: the save is refused with what, why and the fix, and the buffers of the save before stay as they were."""
    from sprite.runtime.ckpt import dcp_write, durable

    free = [10 << 20]
    monkeypatch.setattr(dcp_write, "shm_free", lambda: free[0])
    host = stage.HostCopy(shared=True)
    first = host.copy({"w": torch.ones(1024)})  # 4 KiB: fits
    kept = host.buffers[0].data_ptr()
    free[0] = 8 << 20
    with pytest.raises(durable.SaveFailed) as refused:
        host.copy({"w": torch.ones(1024), "exp_avg": torch.ones(3 << 20)})  # 12 MiB more
    message = str(refused.value)
    assert "needs 12.0 MiB of shared memory" in message and "/dev/shm has 8.0 MiB free" in message
    assert "still holds the save before's copy" in message and "previous checkpoint is kept" in message
    assert "--checkpoint-writer thread" in message and "\n" not in message and len(message) < 700
    assert len(host.buffers) == 1 and host.buffers[0].data_ptr() == kept and torch.equal(first["w"], torch.ones(1024))
    with pytest.raises(durable.SaveFailed) as first_save:  # a first layout: no block held before it
        stage.HostCopy(shared=True).copy({"exp_avg": torch.ones(3 << 20)})
    assert "still holds" not in str(first_save.value)
    free[0] = 13 << 20
    grown = host.copy({"w": torch.ones(1024), "exp_avg": torch.ones(3 << 20)})
    assert torch.equal(grown["exp_avg"], torch.ones(3 << 20)) and host.buffers[0].data_ptr() != kept
    free[0] = 0  # a save of unchanged shapes takes no new block and asks for no room
    assert torch.equal(host.copy({"w": torch.zeros(1024), "exp_avg": torch.ones(3 << 20)})["w"], torch.zeros(1024))
    monkeypatch.setattr(dcp_write, "shm_free", lambda: None)  # no /dev/shm: torch shares memory its own way there
    assert stage.HostCopy(shared=True).copy({"w": torch.ones(4)})["w"].sum() == 4
    assert stage.HostCopy().copy({"w": torch.ones(4)})["w"].sum() == 4  # unshared buffers: no room asked for


@pytest.mark.parametrize("one_block", [True, False])
def test_a_shared_copy_reaches_another_process_as_one_descriptor_not_one_per_tensor(monkeypatch, one_block):
    """What torch's pipe to its checkpoint process does with the staged state (multiprocessing's ForkingPickler,
    torch's reductions): each shared storage becomes a descriptor fetched from this process (DupFd). One block:
    one; a block each (ONE_BLOCK False, the benchmark's --buffer-per-tensor): one per tensor."""
    from multiprocessing import reduction

    import torch.multiprocessing  # noqa: F401  (registers torch's reductions)

    monkeypatch.setattr(stage, "ONE_BLOCK", one_block)
    sent, dup = [], reduction.DupFd
    monkeypatch.setattr(reduction, "DupFd", lambda fd: sent.append(fd) or dup(fd))
    copied = stage.HostCopy(shared=True).copy({f"t{n}": torch.full((n + 1,), float(n)) for n in range(12)})
    back = reduction.ForkingPickler.loads(reduction.ForkingPickler.dumps(copied))
    assert len(sent) == (1 if one_block else 12)
    assert all(torch.equal(back[f"t{n}"], torch.full((n + 1,), float(n))) for n in range(12))


@ON_CUDA
@pytest.mark.parametrize("one_block", [True, False])
def test_a_buffer_replaced_after_a_layout_change_is_unpinned_and_forgotten(monkeypatch, one_block):
    """A tensor whose shape changed between saves gets a new buffer (with ONE_BLOCK, every buffer a new block); the
    memory it replaces is unpinned (cudaHostUnregister) and no longer listed, so the pinned memory does not grow
    save after save."""
    monkeypatch.setattr(stage, "ONE_BLOCK", one_block)
    host = stage.HostCopy(shared=True)
    host.copy({"w": torch.ones(1024, device="cuda")})
    first = host.registered[0]
    assert len(host.registered) == 1 and first.data_ptr() == host.buffers[0].data_ptr()
    copied = host.copy({"w": torch.ones(2048, device="cuda")})
    assert copied["w"].shape == (2048,) and len(host.registered) == 1
    assert not any(mine is first for mine in host.registered)
    assert host.registered[0].data_ptr() == host.buffers[0].data_ptr()
    host.release()
    assert host.registered == [] and host.buffers == []
