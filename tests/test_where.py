"""Where a rank's main thread is, as the heartbeat's WHERE names it, and the frame a crash verdict names."""

from __future__ import annotations

import datetime
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ddptop.core.places import is_script, is_script_line
from ddptop.trainer import hooks
from ddptop.trainer import where as where_module


def test_where_names_the_main_thread_s_innermost_line_of_the_script_s_own_code():
    """Asked from another thread (as the sender asks), past the standard library's frames (join)."""
    seen: list[str] = []
    asker = threading.Thread(target=lambda: seen.append(where_module.sample().where))

    def waiting_here() -> None:
        asker.start()
        asker.join()

    waiting_here()
    assert seen[0].startswith("test_where.py:") and seen[0].endswith(" in waiting_here"), seen


def test_ddptop_s_own_frames_are_not_the_script_s_wherever_it_is_installed():
    assert not is_script(hooks.__file__)  # an editable install puts it in this checkout, outside any site-packages
    assert not is_script("/venv/lib/python3.11/site-packages/torch/nn/modules/module.py")
    assert not is_script("/usr/lib/python3.11/threading.py") and not is_script("<frozen importlib._bootstrap>")
    assert is_script("/home/u/ddptop/examples/train.py")  # a user's folder may be named like the tool


def sampled_from_another_thread() -> where_module.Sample:
    """The main thread's sample as the sender thread takes it, while this test's frame is the innermost."""
    seen: list[where_module.Sample] = []
    asker = threading.Thread(target=lambda: seen.append(where_module.sample()))
    asker.start()
    asker.join()
    return seen[0]


def test_the_stack_runs_outermost_first_with_the_script_s_frames_named_by_file_alone():
    sample = sampled_from_another_thread()
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    assert sample.stack[-1].startswith(f"{version}/threading.py:")  # start() or join(): the standard library, by version
    script = [line for line in sample.stack if is_script_line(line)]
    assert script[-1] == sample.where and sample.where.endswith(" in sampled_from_another_thread")
    assert any(line.startswith("_pytest/") for line in sample.stack)  # an installed package, from its folder down
    assert sample.inside is None


class SampledOnWrite:
    """A file torch.save writes to, whose first write has the main thread sampled as the sender's
    thread samples it: inside torch.save's frames."""

    def __init__(self) -> None:
        self.seen: list[where_module.Sample] = []

    def write(self, data: bytes) -> int:
        if not self.seen:
            self.seen.append(sampled_from_another_thread())
        return len(data)

    def flush(self) -> None:
        pass


def test_a_main_thread_inside_torch_save_is_checkpointing_and_one_training_is_not():
    import torch

    out = SampledOnWrite()
    torch.save({"weights": torch.zeros(4)}, out)
    assert out.seen[0].checkpoint
    assert any(line.startswith("torch/serialization.py:") for line in out.seen[0].stack)
    assert not sampled_from_another_thread().checkpoint


def test_a_module_in_eval_mode_called_after_a_step_is_an_evaluation_and_a_transform_is_not():
    """Rank 0 evaluating through `model.module`: no DDP forward marks it, but the heartbeat's look
    at the stack finds nn.Module's call of a module in eval mode, after the step ended ("data").
    A module in train mode (an augmentation), or one a DataLoader's dataset calls, loads data."""
    import torch
    from torch.utils.data import DataLoader

    seen: list[where_module.Sample] = []

    class Probe(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(sampled_from_another_thread())
            return x

    probe = Probe()
    with torch.no_grad():
        probe.eval()(torch.zeros(1))
        probe.train()(torch.zeros(1))
        encoded = probe.eval()
        list(DataLoader([torch.zeros(1)], collate_fn=lambda batch: [encoded(x) for x in batch]))
    evaluating, augmenting, loading = seen
    outside = sampled_from_another_thread()
    assert evaluating.model and not evaluating.checkpoint
    assert not augmenting.model and not loading.model and not outside.model
    told = [where_module.Phase().of(look, "data", 7) for look in (augmenting, loading, outside)]
    assert told == ["data", "data", "data"]
    # One heartbeat's look a second: an evaluation's lines between its forwards call no module.
    phase = where_module.Phase()
    looks = [(outside, "data", 7), (evaluating, "data", 7), (outside, "data", 7), (outside, "forward", 7), (outside, "data", 8)]
    assert [phase.of(*look) for look in looks] == ["data", "eval", "eval", "forward", "data"]
    saving = where_module.Sample("x.py:1 in f", None, (), checkpoint=True)
    assert [phase.of(*look) for look in ((evaluating, "data", 8), (saving, "data", 8), (outside, "data", 8))] == [
        "eval",
        "checkpoint",
        "data",
    ]


def test_a_rank_out_of_data_under_ddp_s_join_is_joined_not_waiting_for_its_data():
    """A rank whose inputs ran out sits in Join's exit, shadowing the others' collectives, for as
    long as they train on: its state read "data". Here a real Join over a real group, sampled
    inside its exit (a joinable's post-hook, which Join's exit calls), as the sender samples it."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.join import Join, Joinable, JoinHook

    seen: list[where_module.Sample] = []
    notifying: list[where_module.Sample] = []

    class Sampled(JoinHook):
        def post_hook(self, is_last_joiner: bool) -> None:
            seen.append(sampled_from_another_thread())

    class Loop(Joinable):
        def __init__(self) -> None:  # abstract in Joinable, which sets up its join config
            super().__init__()
            self.sampling = False

        def join_hook(self, **kwargs: object) -> JoinHook:
            return Sampled()

        @property
        def join_device(self) -> torch.device:
            if self.sampling:  # asked by notify_join_context, as a DDP forward under Join asks it
                notifying.append(sampled_from_another_thread())
            return torch.device("cpu")

        @property
        def join_process_group(self) -> object:
            return dist.group.WORLD

    # A group of its own, gone with the test: another test of this module starts the default group too.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        loop = Loop()
        with Join([loop]):
            outside = sampled_from_another_thread()
            loop.sampling = True
            Join.notify_join_context(loop)  # a training rank's every DDP forward: inside Join's code, not joined
            loop.sampling = False
    finally:
        dist.destroy_process_group()
    [joined], [training] = seen, notifying
    assert any("algorithms/join.py" in line for line in training.stack)
    assert joined.joined and not outside.joined and not training.joined
    assert [where_module.Phase().of(look, "data", 7) for look in (joined, outside, training)] == ["joined", "data", "data"]


PARTNER = """
import sys, time, torch.distributed as dist
dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 2), rank=1, world_size=2)
time.sleep(60)
"""


@pytest.mark.slow
def test_inside_names_the_torch_distributed_call_the_main_thread_waits_in(tmp_path):
    """A real gloo barrier that waits for a rank that joined the group but never comes to it."""
    import torch.distributed as dist

    store = str(tmp_path / "store")
    partner = subprocess.Popen([sys.executable, "-c", PARTNER, store])
    try:
        dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=0, world_size=2)
        seen: list[where_module.Sample] = []

        def ask() -> None:
            end = time.monotonic() + 20
            while time.monotonic() < end:
                now = where_module.sample()
                if now.inside is not None:
                    seen.append(now)
                    return
                time.sleep(0.01)  # a poll's pace, not a wait for an event

        asker = threading.Thread(target=ask)
        asker.start()
        with pytest.raises(RuntimeError):
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=3))
        asker.join()
        dist.destroy_process_group()
    finally:
        partner.kill()
        partner.wait()
    assert seen and seen[0].inside == "monitored_barrier", seen
    assert seen[0].where.startswith("test_where.py:") and seen[0].where.endswith(
        " in test_inside_names_the_torch_distributed_call_the_main_thread_waits_in"
    )


def test_deep_recursion_is_walked_to_a_bound_and_no_main_frame_is_native(monkeypatch):
    def down(n: int) -> where_module.Sample:
        return down(n - 1) if n else sampled_from_another_thread()

    deep = down(500)
    assert len(deep.stack) == where_module.STACK_FRAMES and deep.where.endswith(" in sampled_from_another_thread")
    monkeypatch.setattr(sys, "_current_frames", lambda: {})  # the main thread in C code before any Python ran
    assert where_module.sample() == where_module.NOWHERE and where_module.NOWHERE.where == "in native code"


def test_a_frame_the_walk_cannot_read_gives_nowhere_not_an_exception(monkeypatch):
    def broken() -> dict:
        raise RuntimeError("no frames today")

    monkeypatch.setattr(sys, "_current_frames", broken)
    assert where_module.sample() == where_module.NOWHERE


def test_a_forked_rank_s_stack_ends_at_its_script_not_in_the_template():
    """The template's frames (the fork's caller) lie below the script's: the stack a heartbeat sends stops there."""
    template = compile("def run(script):\n    return script()\n", str(Path(where_module.__file__).parent / "template" / "child.py"), "exec")
    space: dict = {}
    exec(template, space)

    def script_main() -> where_module.Sample:
        return sampled_from_another_thread()

    stack = space["run"](script_main).stack
    assert stack[0].startswith("test_where.py:") and stack[0].endswith(" in script_main"), stack
    assert not any("template" in frame for frame in stack), stack
