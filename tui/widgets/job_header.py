"""The job header: what is running, for how long, and how fast overall."""

from __future__ import annotations

from textual.widgets import Static

from ddptop.core.format import count, duration, ms
from ddptop.core.model.job import JobState
from ddptop.core.model.metrics import COMM_MS, LOSS, SAMPLES_PER_S, STEP_MS_P50, STEP_MS_P95, TOKENS_PER_S
from ddptop.core.model.summary import guard_parts
from ddptop.core.model.totals import JobTotals


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


class JobHeader(Static):
    """Two lines that never wrap (CSS), so an update never needs a layout pass."""

    _shown = ""

    def show(self, state: JobState, now: float, status: str) -> None:
        totals = state.totals()
        meta = state.meta
        done = totals.steps_done
        progress = "-" if done is None else f"{done}" + (f"/{state.total_steps}" if state.total_steps else "")
        nodes = meta.get("nnodes", "1")
        script = str(meta.get("script", "?")).rsplit("/", 1)[-1]
        text = (
            f"[b]{script}[/b]  {status}  "
            f"{world(state)}  nodes {nodes}  up {duration(now - state.started)}  "
            f"restarts {state.restarts}  alerts {state.alerts}"
            + ("" if (split := state.goodput.split(now)) is None else f"  goodput {split['goodput']:.0%}")
            + ("" if state.checkpoint_step is None else f"  ckpt {state.checkpoint_step}")
            + "\n"
            f"steps {progress}  ETA {eta(state, totals)}  "
            f"[b]{count(totals.of(SAMPLES_PER_S))}[/b] samples/s  "
            + ("" if (tokens := totals.of(TOKENS_PER_S)) is None else f"{count(tokens)} tokens/s  ")
            + ("" if (loss := totals.of(LOSS)) is None else f"loss {LOSS.text(loss)}  ")
            + f"step {ms(totals.of(STEP_MS_P50))}/{ms(totals.of(STEP_MS_P95))} ms  "
            f"comm {ms(totals.of(COMM_MS))} ms" + "".join(f"  {part}" for part in guard_parts(totals))
        )
        if text != self._shown:  # re-rendering markup ten times a second is not free
            self._shown = text
            self.update(text, layout=False)
