"""Make docs/dashboard.svg, the README's picture, from a real run.

Runs the example job under `ddptop launch --headless` with 4 ranks (CPU
ranks on gloo without a GPU), a NaN at step 400, a rank killed at step 900
(torchrun restarts the group, which resumes from its checkpoint) and a
straggler from step 1400 of the restarted attempt; then replays the run in the real dashboard at
200x50 and saves what it shows as SVG.

    .venv/bin/python docs/screenshot.py            # about two minutes on 2 cores
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ddptop.core import rundir
from ddptop.tui.app import DdptopApp
from ddptop.tui.source import ReplaySource

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "dashboard.svg"
SIZE = (200, 50)


def run_job(work: Path) -> rundir.RunDir:
    run_dir = work / "run"
    job = [
        *("--gpus", "4", "--headless", "--run-dir", str(run_dir)),
        str(ROOT / "examples" / "train.py"),
        *("--steps", "1800", "--checkpoint-dir", str(work / "ckpt"), "--checkpoint-every", "200"),
        *("--inject", "nan@400:1", "--inject", "kill@900:2", "--inject", "slow@1400:3/1"),
    ]
    ddptop = Path(sys.executable).parent / "ddptop"  # the venv's, beside its interpreter
    env = {**os.environ, "DDPTOP_HOME": str(work / "home")}  # the run is listed there, not among the user's runs
    with open(work / "launch.log", "w") as log:
        done = subprocess.run([str(ddptop), "launch", *job], stdout=log, stderr=subprocess.STDOUT, env=env)
    if done.returncode != 0:
        sys.exit(f"the job failed (exit {done.returncode}); its output:\n{(work / 'launch.log').read_text()[-4000:]}")
    return rundir.RunDir(run_dir)


async def screenshot(run: rundir.RunDir) -> None:
    app = DdptopApp(ReplaySource(run), "replay", run.path)
    async with app.run_test(size=SIZE) as pilot:
        while not app.stream_ended:
            await asyncio.sleep(0.05)
        app.redraw()
        await pilot.pause()
        app.draw_plots()
        await pilot.pause()
        app.save_screenshot(filename=OUT.name, path=str(OUT.parent))


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="ddptop-screenshot-") as work:
        run = run_job(Path(work))
        asyncio.run(screenshot(run))
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
