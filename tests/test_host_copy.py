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


@ON_CUDA
def test_a_buffer_replaced_after_a_layout_change_is_unpinned_and_forgotten():
    """A tensor whose shape changed between saves gets a new buffer; the one it replaces is unpinned
    (cudaHostUnregister) and no longer listed, so the pinned memory does not grow save after save."""
    host = stage.HostCopy(shared=True)
    host.copy({"w": torch.ones(1024, device="cuda")})
    first = host.buffers[0]
    assert any(mine is first for mine in host.registered)
    copied = host.copy({"w": torch.ones(2048, device="cuda")})
    assert copied["w"].shape == (2048,) and len(host.registered) == 1
    assert not any(mine is first for mine in host.registered)
    host.release()
    assert host.registered == [] and host.buffers == []
