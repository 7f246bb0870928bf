"""After the script's name, an option the script declares is the script's: read from its source."""

import textwrap
from pathlib import Path

import pytest

from ddptop.supervisor.launching.args import split
from ddptop.supervisor.launching.script_options import declared


def script(tmp_path: Path, source: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


@pytest.mark.parametrize(
    "source, expected",
    [
        (
            """
            import argparse
            parser = argparse.ArgumentParser()
            parser.add_argument("-c", "--clip-grad", type=float)
            group = parser.add_argument_group("restarts")
            group.add_argument("--max_restarts", type=int)
            """,
            {"-c", "--clip-grad", "--max_restarts"},
        ),
        (
            """
            import click
            @click.command()
            @click.option("--clip-grad", type=float)
            @click.option("--headless/--no-headless", default=False)
            def main(clip_grad, headless):
                pass
            """,
            {"--clip-grad", "--headless", "--no-headless"},
        ),
        (
            """
            import typer
            app = typer.Typer()
            @app.command()
            def train(on_nan: str = "skip", headless: bool = False, steps: int = typer.Option(10, "--steps", "-s")):
                pass
            """,
            {"--on-nan", "--headless", "--no-headless", "--steps", "-s"},
        ),
        (
            """
            import fire
            def main(clip_grad=None, lr=0.1):
                pass
            fire.Fire(main)
            """,
            {"--clip_grad", "--clip-grad", "--lr"},
        ),
        (
            """
            from dataclasses import dataclass, field
            from transformers import HfArgumentParser
            @dataclass
            class Args:
                clip_grad: float = field(default=1.0)
                headless: bool = True
            args, = HfArgumentParser(Args).parse_args_into_dataclasses()
            """,
            {"--clip_grad", "--clip-grad", "--headless", "--no_headless", "--no-headless"},
        ),
        (
            """
            import sys
            if "--headless" in sys.argv:
                pass
            """,
            {"--headless"},
        ),
    ],
    ids=["argparse", "click", "typer", "fire", "HfArgumentParser", "sys.argv"],
)
def test_each_parser_s_options_are_read_from_the_source(tmp_path, source, expected):
    assert expected <= declared(script(tmp_path, source))


def test_a_dataclass_is_no_option_where_no_parser_makes_it_one(tmp_path):
    found = declared(script(tmp_path, "from dataclasses import dataclass\n@dataclass\nclass Config:\n    gpus: int = 2\n"))
    assert "--gpus" not in found


def test_a_parser_in_a_module_beside_the_script_counts(tmp_path):
    (tmp_path / "opts").mkdir()
    script(
        tmp_path, "import argparse\ndef parse():\n    p = argparse.ArgumentParser()\n    p.add_argument('--clip-grad')\n", "opts/config.py"
    )
    (tmp_path / "opts" / "__init__.py").write_text("")
    assert "--clip-grad" in declared(script(tmp_path, "from opts.config import parse\nparse()\n"))
    assert "--clip-grad" in declared(script(tmp_path, "import opts.config\n", "other.py"))


def test_an_unreadable_script_declares_nothing(tmp_path):
    assert declared(tmp_path / "missing.py") == frozenset()
    assert declared(script(tmp_path, "def (:\n")) == frozenset()


def test_the_script_s_own_option_reaches_it_and_ddptop_says_what_it_took_and_left(tmp_path):
    path = script(
        tmp_path,
        "import argparse\np = argparse.ArgumentParser()\np.add_argument('--clip-grad', type=float)\np.add_argument('--headless', action='store_true')\n",
    )
    args = split([str(path), "--gpus", "2", "--clip-grad", "1.0", "--headless", "--on-nan", "stop"])
    assert args.script_args == ["--clip-grad", "1.0", "--headless"]
    assert (args.options.gpus, args.options.clip_grad, args.options.headless, args.options.on_nan) == (2, None, False, "stop")
    assert args.notice == (
        "--clip-grad 1.0, --headless go to train.py, which declares them; ddptop took --gpus 2, --on-nan stop "
        "(ddptop's own go before the script: ddptop launch --clip-grad 1.0 --headless train.py ...)"
    )


def test_before_the_script_every_option_is_ddptop_s_and_after_double_dash_the_script_s(tmp_path):
    path = script(tmp_path, "import argparse\nargparse.ArgumentParser().add_argument('--clip-grad')\n")
    args = split(["--clip-grad", "2", str(path), "--", "--gpus", "3"])
    assert args.options.clip_grad == 2.0 and args.options.gpus is None
    assert args.script_args == ["--gpus", "3"] and args.notice is None


def test_an_option_the_script_does_not_declare_is_ddptop_s_without_a_word(tmp_path):
    path = script(tmp_path, "import argparse\nargparse.ArgumentParser().add_argument('--lr')\n")
    args = split([str(path), "--clip-grad=1.5", "--lr", "3"])
    assert args.options.clip_grad == 1.5 and args.script_args == ["--lr", "3"] and args.notice is None


def test_a_module_s_options_are_read_from_its_file(tmp_path, monkeypatch):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    script(tmp_path, "import argparse\nargparse.ArgumentParser().add_argument('--max-restarts', type=int)\n", "pkg/train.py")
    monkeypatch.chdir(tmp_path)
    args = split(["-m", "pkg.train", "--max-restarts", "5", "--gpus", "2"])
    assert args.script_args == ["--max-restarts", "5"] and args.options.max_restarts == 3
    assert args.notice is not None and args.notice.startswith("--max-restarts 5 goes to pkg.train, which declares it")


def test_a_program_that_is_not_python_declares_nothing_ddptop_can_read(tmp_path):
    program = script(tmp_path, "#!/bin/sh\necho --clip-grad\n", "run.sh")
    args = split(["--no-python", str(program), "--clip-grad", "1"])
    assert args.options.clip_grad == 1.0 and args.script_args == []
