"""The OOM kill count of a memory cgroup: the kernel's own, where a cgroup can be made, and its files' two formats."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ddptop.supervisor.launching import oom_kills

HOG = "bytearray(3 << 30)"
"""Three GiB at once: past the test cgroup's 1.5 GiB."""


def test_a_process_the_oom_killer_kills_is_counted_in_its_memory_cgroup(memory_limited_cgroup: Path):
    procs = str(memory_limited_cgroup / "cgroup.procs")
    join_then_hog = f"import os, sys\nopen(sys.argv[1], 'w').write(str(os.getpid()))\n{HOG}"
    hog = subprocess.run([sys.executable, "-c", join_then_hog, procs], capture_output=True, text=True, timeout=120)
    assert hog.returncode == -9, hog.stderr
    counter = memory_limited_cgroup / ("memory.events" if (memory_limited_cgroup / "memory.events").exists() else "memory.oom_control")
    assert oom_kills.count(counter) == 1


def test_the_count_is_read_from_either_version_of_the_file(tmp_path: Path):
    v2 = tmp_path / "memory.events"
    v2.write_text("low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\noom_group_kill 0\n")
    v1 = tmp_path / "memory.oom_control"
    v1.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n")
    old = tmp_path / "old.oom_control"
    old.write_text("oom_kill_disable 0\nunder_oom 0\n")  # a kernel before 4.13 counts none
    assert (oom_kills.count(v2), oom_kills.count(v1), oom_kills.count(old), oom_kills.count(None)) == (2, 7, None, None)


def test_the_counter_of_this_process_is_where_its_cgroup_line_says(tmp_path: Path):
    """Laid out under a root of the test's own, as /proc/self/cgroup names this process's cgroups."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        if number == "0" and controllers == "":
            folder, name = tmp_path / path.lstrip("/"), "memory.events"
        elif "memory" in controllers.split(","):
            folder, name = tmp_path / "memory" / path.lstrip("/"), "memory.oom_control"
        else:
            continue
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("oom_kill 4\n")
        assert oom_kills.counter(root=tmp_path) == folder / name
        assert oom_kills.count(oom_kills.counter(root=tmp_path)) == 4
        return
    assert oom_kills.counter(root=tmp_path) is None, "no memory cgroup line: nothing to count in"
