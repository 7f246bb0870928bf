"""The pinned ring's turns on a machine without a GPU: what a late value reads as, when.

A slot's CUDA event cannot exist here, so the ring is handed a stand-in with an event's
record, query and synchronize, which a test's `Device` passes when it says the GPU has
caught up (stand_in_gpu.py). The copies are real tensor copies (unpinned: pinning needs a GPU). The same
ring on a real GPU: tests/test_cuda.py.
"""

from __future__ import annotations

import torch
from ops_seen import OpsSeen
from stand_in_gpu import Device

from ddptop.trainer import late


def ring(slots: int) -> tuple[late.PinnedRing, Device]:
    device = Device()
    return late.PinnedRing(slots, event=device.event, stream=device.stream), device


def test_a_value_is_ready_once_its_copy_has_passed_and_reads_decoded_without_a_wait():
    values, device = ring(4)
    read = values.send(torch.tensor([1.5, 2.0]), decode=lambda got: {"sum": sum(got)})
    assert not read.ready(), "its copy is still queued"
    device.catch_up()
    assert read.ready() and read.get() == {"sum": 3.5} and device.waits == 0
    assert read.get() == {"sum": 3.5}, "read once, kept"


def test_a_value_whose_slot_was_reused_before_it_was_read_reads_as_none_never_as_the_next_value():
    values, device = ring(2)
    first = values.send(torch.tensor([1.0]))
    values.send(torch.tensor([2.0]))
    third = values.send(torch.tensor([3.0]))  # the first one's slot, two values later
    assert first.ready(), "a reader must not wait for a value that is gone"
    assert first.get() is None and device.waits == 0, "nor wait for the copy that took its slot"
    device.catch_up()
    assert third.get() == [3.0]


def test_a_read_forced_before_its_copy_passed_waits_for_it():
    values, device = ring(4)
    read = values.send(torch.tensor([7.0]))
    assert read.get() == [7.0] and device.waits == 1


def test_each_shape_and_dtype_takes_turns_in_a_ring_of_its_own():
    values, device = ring(2)
    pairs = [values.send(torch.tensor([float(i), 0.0])) for i in range(2)]
    three = values.send(torch.tensor([1, 2, 3]))
    wide = values.send(torch.tensor([9.0], dtype=torch.float64))
    device.catch_up()
    assert [read.get() for read in pairs] == [[0.0, 0.0], [1.0, 0.0]], "no other shape took their slots"
    assert three.get() == [1, 2, 3] and wide.get() == [9.0]


def test_a_ring_is_made_in_as_many_ops_whatever_its_slots():
    """A shape's first value makes its ring on the training thread: 1,024 slots on a GPU, each
    with its own views of the block. They are made by a few ops for all, not two ops a slot."""
    made = {}
    for slots in (4, 64):
        values, device = ring(slots)
        with OpsSeen() as seen:
            read = values.send(torch.tensor([1.0, 2.0]))
        device.catch_up()
        assert read.get() == [1.0, 2.0]
        made[slots] = seen.names
    assert made[4] == made[64], made


class OnDevice(torch.Tensor):
    """A CPU tensor that says which CUDA device holds it (get_device, what the ring keys by)."""

    index = 0

    def get_device(self) -> int:  # type: ignore[override]
        return self.index


def on_device(index: int, values: list[float]) -> OnDevice:
    tensor = torch.Tensor._make_subclass(OnDevice, torch.tensor(values))
    tensor.index = index
    return tensor


def test_a_slots_event_is_recorded_on_the_stream_its_copy_is_queued_on_now():
    values, device = ring(4)
    first = values.send(on_device(0, [1.0]))
    device.current[0] = "side"  # the script switched streams (torch.cuda.stream(side))
    second = values.send(on_device(0, [2.0]))
    slots = [read[0] for read in (first, second)]
    assert [slot.event.streams[-1] for slot in slots] == ["default", "side"]
    device.catch_up()
    assert (first.get(), second.get()) == ([1.0], [2.0])


def test_a_value_on_another_device_than_the_current_one_takes_a_ring_whose_events_are_that_devices():
    """A script that never calls set_device: its tensors on cuda:1, cuda:0 current. The copy runs
    on cuda:1's stream, and an event recorded on cuda:0's would pass before it."""
    values, device = ring(2)
    device.current = {0: "cuda:0's", 1: "cuda:1's"}
    zero, one = values.send(on_device(0, [1.0])), values.send(on_device(1, [2.0]))
    assert zero[0] is not one[0], "one ring a device"
    assert set(one[0].event.streams) == {"cuda:1's"}, "made and recorded on its own device's stream alone"
    assert set(zero[0].event.streams) == {"cuda:0's"}
    device.catch_up()
    assert (zero.get(), one.get()) == ([1.0], [2.0])
