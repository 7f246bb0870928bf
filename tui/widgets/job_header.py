"""The job header: what is running, for how long, and how fast overall."""

from __future__ import annotations

import functools

from rich.markup import escape
from rich.text import Text
from textual.widgets import Static

from ddptop.core.format import count, duration, ms, nbytes
from ddptop.core.model.job import JobState
from ddptop.core.model.metrics import BUS_BANDWIDTH, COMM_MS, LOSS, RSS, SAMPLES_PER_S, STEP_MS_P50, STEP_MS_P95, TOKENS_PER_S
from ddptop.core.model.summary import guard_parts
from ddptop.core.model.totals import JobTotals

FROM_OUTSIDE = "watched from outside: no steps, loss or comm times"
"""The second line of a job ddptop did not launch, in place of figures it cannot have."""


def eta(state: JobState, totals: JobTotals) -> str:
    """Remaining time from the steps left and the job's median step time."""
    done, total, step_ms = totals.steps_done, state.total_steps, totals.of(STEP_MS_P50)
    if not (done is not None and total and step_ms) or state.exit is not None:
        return "-"
    return duration(max(0, total - done) * step_ms / 1000.0)


def world(state: JobState) -> str:
    """The ranks, and how the script started them when it was not one rank per torchrun worker."""
    style, gpus = state.meta.get("launch_style"), state.meta.get("gpus")
    if style == "single":
        return "1 process (DataParallel" + (f", {gpus} GPUs)" if gpus else ")")
    return f"world {state.world_size or '?'}" + ("  spawned by the script" if style == "spawn" else "")


GAP = "  "

Part = tuple[int, str, int]
"""One figure of a header line: how long it may stay (0: always; higher ones go first when
the line is too narrow), its markup, and its width in cells."""


def plain(need: int, text: str) -> Part:
    """A part without markup: its width is its length."""
    return need, text, len(text)


def bold(need: int, value: str, after: str = "") -> Part:
    """A part whose value is bold (escaped: a script's name may hold brackets), then plain text
    after it: its width is theirs, not the markup's."""
    return need, f"[b]{escape(value)}[/b]{after}", len(value) + len(after)


def fit(parts: list[Part], width: int) -> str:
    """The line's parts that fit in width cells, in their order: where they do not all fit, the
    least needed go first (the highest `need`, rightmost first), so at 80 columns the header
    keeps the alerts and the comm time rather than whatever happens to come first. What is left
    too long is cut by the widget's ellipsis. A width of 0 (not laid out yet) keeps them all."""
    total = sum(cells for _, _, cells in parts) + len(GAP) * (len(parts) - 1)
    dropped: set[int] = set()
    if width:
        for at in sorted(range(len(parts)), key=lambda i: (-parts[i][0], -i)):
            if total <= width or not parts[at][0]:
                break
            dropped.add(at)
            total -= parts[at][2] + len(GAP)
    return GAP.join(text for at, (_, text, _) in enumerate(parts) if at not in dropped)


def figures(state: JobState, totals: JobTotals) -> list[Part]:
    """The second line of a job ddptop launched: its steps and how fast they go."""
    done = totals.steps_done
    progress = "-" if done is None else f"{done}" + (f"/{state.total_steps}" if state.total_steps else "")
    second = [
        plain(1, f"steps {progress}"),
        plain(3, f"ETA {eta(state, totals)}"),
        bold(0, count(totals.of(SAMPLES_PER_S)), " samples/s"),
    ]
    if (tokens := totals.of(TOKENS_PER_S)) is not None:
        second.append(plain(2, f"{count(tokens)} tokens/s"))
    if (loss := totals.of(LOSS)) is not None:
        second.append(plain(0, f"loss {LOSS.text(loss)}"))
    second.append(plain(3, f"step {ms(totals.of(STEP_MS_P50))}/{ms(totals.of(STEP_MS_P95))} ms"))
    second.append(plain(1, f"comm {ms(totals.of(COMM_MS))} ms"))
    if (busbw := totals.of(BUS_BANDWIDTH)) is not None:
        second.append(plain(3, f"busbw {BUS_BANDWIDTH.text(busbw)}"))
    second += [plain(1, part) for part in guard_parts(totals)]
    return second


@functools.lru_cache(maxsize=64)
def cells(markup: str) -> int:
    """The width of a status's markup (few and repeated: parsing markup costs a tick's share)."""
    return Text.from_markup(markup).cell_len


class JobHeader(Static):
    """Two lines that never wrap (CSS), so an update never needs a layout pass; each keeps
    what fits the width, the figures that say what is wrong first (fit)."""

    _shown = ""
    _last: tuple[JobState, float, str] | None = None

    def show(self, state: JobState, now: float, status: str) -> None:
        self._last = (state, now, status)
        totals = state.totals()
        meta = state.meta
        script = str(meta.get("script", "?")).rsplit("/", 1)[-1]
        first = [
            bold(0, script),
            (0, status, cells(status)),
            plain(2, world(state)),
            plain(4, f"nodes {meta.get('nnodes', '1')}"),
            plain(3, f"up {duration(now - state.started)}"),
            plain(1, f"restarts {state.restarts}"),
            plain(0, f"alerts {state.alerts}"),
        ]
        if not state.outside and (split := state.goodput.split(now)) is not None:
            first.append(plain(2, f"goodput {split['goodput']:.0%}"))
        if state.checkpoint_step is not None:
            first.append(plain(4, f"ckpt {state.checkpoint_step}"))
        second = [bold(0, FROM_OUTSIDE), plain(1, f"rss {nbytes(totals.of(RSS))}")] if state.outside else figures(state, totals)
        width = self.content_size.width
        text = fit(first, width) + "\n" + fit(second, width)
        if text != self._shown:  # re-rendering markup ten times a second is not free
            self._shown = text
            self.update(text, layout=False)

    def on_resize(self) -> None:
        """A new width fits other parts, even while the dashboard is paused."""
        if self._last is not None:
            self.show(*self._last)
