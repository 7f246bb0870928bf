"""The main screen's charts, driven by Pilot: the room they take, the time-window key, bad data."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from builders import hello
from hypothesis import given, settings
from hypothesis import strategies as st
from support import until
from test_tui_snapshots import BASE, fixed_run
from textual_plotext.plot import Plot

from ddptop.core import rundir
from ddptop.core.eventlog import EventLog
from ddptop.core.format import ms, nbytes
from ddptop.core.model.job import JobState
from ddptop.tui.app import DdptopApp
from ddptop.tui.source import ReplaySource
from ddptop.tui.widgets.chart import Chart
from ddptop.tui.widgets.charts import Charts
from ddptop.tui.widgets.plot_area import fitted_title, title_room
from ddptop.tui.widgets.rank_heatmap import RankHeatmap
from ddptop.tui.widgets.time_axis import value_axis


def replay(run: rundir.RunDir) -> DdptopApp:
    return DdptopApp(ReplaySource(run), "replay", run.path)


async def replayed(app: DdptopApp, pilot) -> None:
    await until(lambda: app.stream_ended, "the run replayed")
    app.main.redraw()
    await pilot.pause()
    app.main.draw_plots()
    await pilot.pause()


def chart(app: DdptopApp, name: str) -> Chart:
    return app.query_one(f"#chart-{name}", Chart)


def caption(app: DdptopApp) -> str:
    return str(app.query_one(Charts).caption.render())


@pytest.mark.slow  # waits for the dashboard's real-time windows: seconds
async def test_w_switches_the_charts_between_the_last_minutes_and_the_whole_run(tmp_path, ddptop_home):
    app = replay(fixed_run(tmp_path / "run", seconds=1000))
    async with app.run_test(size=(160, 40)) as pilot:
        await replayed(app, pilot)
        drawing = chart(app, "throughput").drawing
        assert "whole run" in caption(app) and drawing is not None and drawing.window.first == BASE  # a replay shows it all
        assert [m.kind for m in drawing.window.marks if m.kind in drawing.marks] == ["alert", "alert"]
        await pilot.press("w")
        await pilot.pause()
        drawing = chart(app, "throughput").drawing
        assert "last 10 min" in caption(app) and drawing is not None
        assert drawing.window.first >= app.state.last_wall - 600 and min(drawing.lines[0].xs) >= drawing.window.first - BASE
        assert [m.kind for m in drawing.window.marks if m.kind in drawing.marks] == ["alert"]  # the NaN at 333 s is before the window
        await pilot.press("w")
        await pilot.pause()
        assert "whole run" in caption(app)


@pytest.mark.slow  # waits for the dashboard's real-time windows: seconds
async def test_the_table_gets_its_rows_first_and_the_charts_the_rest(tmp_path, ddptop_home):
    app = replay(fixed_run(tmp_path / "run", seconds=120))
    async with app.run_test(size=(200, 50)) as pilot:
        await replayed(app, pilot)
        charts, table = app.query_one(Charts), app.main.table
        assert table.size.height >= 5 and table.row_count == 4  # the header and every rank
        used = sum(w.outer_size.height for w in (app.main.header, charts, table, app.main.alerts)) + 1  # and the footer
        assert used >= 50 - 2 and charts.grid.styles.grid_size_rows == 2  # nothing left empty but a row or two
        assert chart(app, "throughput").display and chart(app, "memory").display
        await pilot.resize_terminal(80, 24)
        await until(lambda: app.main.arranged is not None and app.main.arranged[0] == 1, "one row of charts at 80x24")
        await pilot.pause()
        assert table.size.height >= 5 and table.region.bottom <= 24  # every rank row still on screen
        assert chart(app, "throughput").display and not chart(app, "memory").display
        await pilot.resize_terminal(40, 10)
        await until(lambda: app.screen.has_class("too-small"), "the too-small message")
        await pilot.resize_terminal(200, 50)
        await until(lambda: app.main.arranged is not None and app.main.arranged[0] == 2, "two rows of charts again")


@pytest.mark.slow  # waits for the dashboard's real-time windows: seconds
async def test_a_run_with_no_loss_one_step_nan_and_a_silent_rank_draws_what_it_has(tmp_path, ddptop_home):
    run = rundir.create(Path("train.py"), tmp_path / "run")
    log, state = EventLog(run.events_path), JobState()
    records = [{"type": "run", "wall": BASE, "id": "odd", "script": "train.py"}]
    for rank in range(3):  # rank 2 says hello and never steps
        records.append(hello(rank, 3))
    records += [{"type": "step", "rank": r, "step": 0, "wall": BASE + 1, "step_ms": 10.0, "comm_ms": math.inf} for r in (0, 1)]
    for record in records:
        log.append(record)
        state.ingest(record)
    summary = state.summary(BASE + 1)
    summary["metrics"]["samples_per_s"] = math.nan
    log.append(summary)
    log.append({"type": "exit", "wall": BASE + 2, "code": 1, "stopped_by_signal": None})
    log.close()
    app = replay(run)
    async with app.run_test(size=(160, 45)) as pilot:
        await replayed(app, pilot)
        assert "no loss reported yet" in str(chart(app, "loss").render())
        assert "no throughput reported yet" in str(chart(app, "throughput").render())  # NaN is not a value
        chart(app, "step-time").render()
        chart(app, "ranks").render()
        await pilot.resize_terminal(40, 10)
        await pilot.resize_terminal(160, 45)
        await pilot.press("w")
        await pilot.pause()
        assert app.is_running


def test_a_y_range_narrower_than_its_labels_can_tell_apart_is_widened_until_each_tick_reads_differently():
    """Memory from 1.00 to 1.06 GiB labelled "1.0 GiB" at every tick would fill the chart's height
    with one label: a change of 6% drawn as if it were a leak."""
    gib = 1024**3
    low, high, ticks, labels = value_axis(1.00 * gib, 1.06 * gib, False, nbytes)
    assert len(set(labels)) == len(ticks) == 3 and low <= 1.00 * gib and high >= 1.06 * gib
    assert value_axis(3.3, 13.3, False, lambda v, _: ms(v)) == (3.3, 13.3, [3.3, 8.3, 13.3], ["3.3", "8.3", "13.3"]), (
        "a range its labels tell apart stays"
    )
    low, high, _, labels = value_axis(0.001, 0.002, False, lambda v, _: ms(v))
    assert low == 0.0 and high > 0.002 and labels[0] == "0.0", "widened, never below zero for values that are not"


def test_a_byte_axis_reads_in_one_unit():
    """Memory from 0.96 to 1.1 GiB labelled "983.0 MiB" beside "1.0 GiB" reads as if the lowest
    tick were the largest: every label of a linear axis is in its largest value's unit."""
    gib = 1024**3
    _, _, ticks, labels = value_axis(0.96 * gib, 1.1 * gib, False, nbytes)
    assert len(set(labels)) == len(ticks) == 3 and all(label.endswith(" GiB") for label in labels), labels
    _, _, _, labels = value_axis(1024.0, 10 * gib, True, nbytes)
    assert labels[0] == "1.0 KiB" and labels[-1] == "10.0 GiB", "a log axis spans units: each tick in its own"


def plotted(width: int, labels: list[str], title: str) -> str:
    """A line plot as the dashboard's charts build it (textual-plotext's Plot), with this title."""
    plt = Plot()
    plt.plotsize(width, 10)
    plt._set_size(width, 10)  # as PlotextPlot.render sets it
    plt.plot([0, 1], [0, 1])
    plt.yticks([0, 1], labels)
    plt.title(title)
    return str(plt.build())


@settings(max_examples=150, deadline=None)
@given(
    width=st.integers(20, 240),
    label_width=st.integers(1, 16),
    heading=st.integers(1, 100),
    notes=st.lists(st.integers(1, 80), max_size=3),
)
def test_a_chart_title_is_the_longest_plotext_draws_heading_first(width, label_width, heading, notes):
    """plotext draws no title at all where it does not fit over the canvas, and says nothing: the
    ranks' chart lost its name and its "slowest now" at the widths most terminals have. The title
    given is drawn whole, keeps the heading first and each note only whole, and title_room is
    plotext's own limit: one column more and it draws nothing."""
    labels = ["y" * label_width, "z" * label_width]
    room = title_room(width, label_width)
    assert "Q" in plotted(width, labels, "t" * (room - 1) + "Q") and "Q" not in plotted(width, labels, "t" * room + "Q")
    texts = ["h" * heading, *("abc"[i] * n for i, n in enumerate(notes))]
    title = fitted_title(texts[0], texts[1:], room)
    assert title in plotted(width, labels, title) and len(title) <= room
    if heading > room:
        assert title == texts[0][: room - 1] + "…"
    else:
        kept = [text for text in texts[1:] if f"  {text}" in title]
        assert title == "  ".join([texts[0], *kept])  # in their order, whole
        for left_out in (text for text in texts[1:] if text not in kept):
            assert len(title) + 2 + len(left_out) > room  # left out only for want of room


@pytest.mark.parametrize("ranks", [4, 64])
async def test_the_ranks_chart_keeps_its_name_and_its_slowest_rank_at_130_columns(tmp_path, ddptop_home, ranks):
    """At 130 columns the ranks' chart (a line a rank, or the heatmap past 8 ranks) is about 86
    columns wide: its title with every note (here also that own work is the data wait alone)
    did not fit, and plotext drew none."""
    app = replay(fixed_run(tmp_path / "run", ranks=ranks, seconds=120, compute=False))
    async with app.run_test(size=(130, 40)) as pilot:
        await replayed(app, pilot)
        widget = app.query_one("#chart-ranks", Chart) if ranks <= 8 else app.query_one(RankHeatmap)
        assert widget.display and widget.size.width < 100
        text = str(widget.render())
        assert "own work per rank" in text and f"slowest now: rank {ranks - 1} at" in text, text
