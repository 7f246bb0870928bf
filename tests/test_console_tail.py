"""The console's copy of a rank's output: a progress bar is redrawn in place, as under plain torchrun.

torchrun's own tee wrote each of a bar's "\\r" redraws as a line of its own. The tail here
runs as torchrun runs it, on a thread that follows a real log file as the rank writes it.
"""

from __future__ import annotations

import io
import threading
from pathlib import Path

from support import wait_for

from ddptop.supervisor.launching import console_tail


def test_a_finished_log_is_written_line_by_line_and_a_bar_redraw_by_redraw_each_keeping_its_return(tmp_path):
    log = tmp_path / "stderr.log"
    log.write_text("epoch 1\n\r  0%|a\r 50%|b\r100%|c\nval 0.9\nno end", newline="")
    out, done = io.StringIO(), threading.Event()
    done.set()
    console_tail.tail_logfile("[rank0]:", str(log), out, done, 0.01)
    assert out.getvalue() == "[rank0]:epoch 1\n[rank0]:  0%|a\r[rank0]: 50%|b\r[rank0]:100%|c\n[rank0]:val 0.9\n[rank0]:no end"


def test_torchrun_s_line_filter_is_kept(tmp_path):
    log = tmp_path / "stderr.log"
    log.write_text("keep\ndrop\n")
    out, done = io.StringIO(), threading.Event()
    done.set()
    console_tail.tail_logfile("[r]:", str(log), out, done, 0.01, log_line_filter=lambda line: line.startswith("keep"))
    assert out.getvalue() == "[r]:keep\n"


def test_a_live_bar_s_redraw_goes_out_as_the_next_begins_and_text_that_ends_no_line_once_it_has_waited(tmp_path, monkeypatch):
    """What ends no line goes out after HELD_S, and the rest of its line after it with no second
    prefix: a redraw's "\\r" still returns to the line's start, a prompt's answer follows it."""
    monkeypatch.setattr(console_tail, "HELD_S", 0.2)
    log = tmp_path / "stderr.log"
    out, done = io.StringIO(), threading.Event()
    tail = threading.Thread(target=console_tail.tail_logfile, args=("[rank0]:", str(log), out, done, 0.01))
    tail.start()
    try:
        with log.open("w", newline="") as rank:

            def writes(text: str) -> None:
                rank.write(text)
                rank.flush()

            writes("step 1\n")
            wait_for(lambda: out.getvalue() == "[rank0]:step 1\n", 5, "a whole line, at once")
            writes("\r 10%|#")
            writes("\r 20%|##")
            wait_for(lambda: "[rank0]: 10%|#\r" in out.getvalue(), 5, "the first redraw, as the second began")
            wait_for(lambda: out.getvalue().endswith("[rank0]: 20%|##"), 5, "the second, once it had waited for its end")
            writes("\r 30%|###\n")
            writes("loading... ")
            wait_for(lambda: out.getvalue().endswith("[rank0]:loading... "), 5, "a prompt, once it had waited")
            writes("done\n")
            wait_for(lambda: out.getvalue().endswith("done\n"), 5, "the rest of its line")
    finally:
        done.set()
        tail.join(5)
    assert not tail.is_alive()
    assert out.getvalue() == "[rank0]:step 1\n[rank0]: 10%|#\r[rank0]: 20%|##\r[rank0]: 30%|###\n[rank0]:loading... done\n"


def test_a_line_after_the_rest_of_a_cut_one_that_the_filter_left_out_has_its_prefix(tmp_path, monkeypatch):
    monkeypatch.setattr(console_tail, "HELD_S", 0.2)
    log = tmp_path / "stderr.log"
    out, done = io.StringIO(), threading.Event()
    tail = threading.Thread(target=console_tail.tail_logfile, args=("[r]:", str(log), out, done, 0.01, lambda line: "x" not in line))
    tail.start()
    try:
        with log.open("w", newline="") as rank:
            rank.write("a ")
            rank.flush()
            wait_for(lambda: out.getvalue() == "[r]:a ", 5, "the line begun, once it had waited")
            rank.write("x\nb\n")
            rank.flush()
            wait_for(lambda: out.getvalue().endswith("b\n"), 5, "the next line")
    finally:
        done.set()
        tail.join(5)
    assert out.getvalue() == "[r]:a [r]:b\n"


def test_a_log_that_never_came_ends_the_tail_when_the_rank_is_done(tmp_path: Path):
    done = threading.Event()
    done.set()
    out = io.StringIO()
    console_tail.tail_logfile("[rank0]:", str(tmp_path / "never.log"), out, done, 0.01)
    assert out.getvalue() == ""
