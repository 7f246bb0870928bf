from pathlib import Path

import pytest

from ddptop.core.usage import UsageError
from ddptop.supervisor.launching.args import split


def test_options_after_the_script_are_ddptops_when_it_knows_them():
    args = split(["train.py", "--gpus", "4", "--lr", "3e-4", "--headless", "--bucket-view"])
    assert args.script == Path("train.py")
    assert args.options.gpus == 4 and args.options.headless and args.options.bucket_view
    assert args.script_args == ["--lr", "3e-4"]


def test_options_before_the_script_and_torchrun_spellings():
    args = split(["--nproc_per_node=2", "--max-restarts", "3", "--rdzv_endpoint", "h:29400", "train.py", "x"])
    assert args.options.nproc_per_node == 2
    assert args.options.max_restarts == 3
    assert args.options.rdzv_endpoint == "h:29400"
    assert args.script_args == ["x"]


def test_everything_after_double_dash_goes_to_the_script():
    args = split(["--gpus", "2", "train.py", "--", "--gpus", "8", "--headless"])
    assert args.options.gpus == 2 and not args.options.headless
    assert args.script_args == ["--gpus", "8", "--headless"]


def test_script_may_follow_double_dash():
    args = split(["--gpus", "2", "--", "train.py", "--steps", "5"])
    assert args.script == Path("train.py") and args.script_args == ["--steps", "5"]


def test_a_module_or_a_program_as_torchrun_runs_them_and_the_script_s_own_m():
    module = split(["--gpus", "4", "-m", "pkg.train", "--lr", "1", "-m", "x"])
    assert (module.module, module.no_python, module.entry) == (True, False, "-m pkg.train")
    assert module.script_args == ["--lr", "1", "-m", "x"]  # after the module, -m is the script's
    program = split(["--no-python", "./run.sh", "--gpus", "2"])
    assert (program.no_python, program.options.gpus, program.entry) == (True, 2, "run.sh")
    plain = split(["train.py", "-m", "y"])
    assert not plain.module and plain.script_args == ["-m", "y"]


def test_options_torchrun_would_take_as_abbreviations_of_its_own_stay_the_script_s():
    args = split(["train.py", "--start", "3", "--max", "4", "--node", "x", "--rdzv", "y"])
    assert args.script_args == ["--start", "3", "--max", "4", "--node", "x", "--rdzv", "y"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--bogus", "train.py"], "unknown option --bogus"),
        (["--gpus", "0", "train.py"], "--gpus"),
        (["--gpus", "two", "train.py"], "--gpus"),
        (["train.py", "--gpus"], "needs a value"),
        (["--gpus", "2"], "no training script"),
        (["train.py", "--gpus", "2", "--nproc-per-node", "2"], "not both"),
        (["train.py", "--summary-every", "-1"], "--summary-every"),
        (["-m", "--no-python", "x"], "-m or --no-python, not both"),
        (["-m"], "no training script"),
    ],
)
def test_bad_input_is_a_usage_error(argv, message):
    with pytest.raises(UsageError, match=message):
        split(argv)


def test_restart_backoff_doubles_after_an_immediate_first_restart():
    from ddptop.supervisor.launching.torchrun_probe import BACKOFF_MAX_S, backoff_s

    assert [backoff_s(n, 1.5) for n in range(1, 6)] == [0.0, 1.5, 3.0, 6.0, 12.0]
    assert backoff_s(30, 1.0) == BACKOFF_MAX_S
    assert backoff_s(4, 0.0) == 0.0


def test_restart_defaults():
    options = split(["train.py"]).options
    assert (options.max_restarts, options.restart_backoff, options.crash_loop) == (3, 1.0, 3)


def test_the_options_are_typed_and_built_once():
    import dataclasses

    from ddptop.supervisor.launching.args import LaunchOptions, option_parser

    args = split(["--gpus", "2", "--on-hang", "stop", "train.py"])
    assert isinstance(args.options, LaunchOptions) and args.options.on_hang == "stop"
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.options.gpus = 3  # type: ignore[misc]
    dests = {action.dest for action in option_parser()._actions}
    assert dests == {f.name for f in dataclasses.fields(LaunchOptions)}, "one field per option, no more"
    assert LaunchOptions.parse([]) == LaunchOptions(), "the parser's defaults are the dataclass's"


def test_every_option_with_a_default_says_which_in_its_help():
    import re

    from ddptop.supervisor.launching.args import OPTIONS, LaunchOptions

    defaults = LaunchOptions()
    for spellings, kwargs in OPTIONS:
        value = getattr(defaults, spellings[0][2:].replace("-", "_"))
        if value is None or value is False:  # unset, or a flag
            continue
        if "choices" in kwargs:
            assert f"{value} (default)" in kwargs["help"], spellings[0]
        else:
            said = re.search(r"default ([0-9.]+)", kwargs["help"])
            assert said and float(said.group(1)) == value, spellings[0]
