"""Job events in words: how an exit code and a restart of the group read.

The watchdog writes these into its verdicts and the dashboard's alert panel
shows restart records with them, so both say the same thing the same way.
"""

from __future__ import annotations

import signal

from ddptop.core.wire import records


def exit_status(code: int) -> int:
    """A process's exit code as a shell reports it: death by signal N is 128+N."""
    return 128 - code if code < 0 else code


def exit_reason(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def restart_text(record: records.GroupRestart, going: bool = False) -> str:
    """A group_restart record in words: count, cause and backoff (none for a restart the user asked for).

    torchrun's probe asks, and holds the restart until the watchdog has judged
    the failure (a crash loop stops the job instead): the record itself is the
    request; `going` says it as the supervisor gives the go."""
    verb = "restarts" if going else "asks to restart"
    text = f"torchrun {verb} the worker group (restart {record['restart']}, {record['remaining']} left)"
    if record.get("asked"):
        return f"{text} after the {record['asked']}"  # at once: no backoff for what the user asked
    if record.get("ordered"):
        text += f" after ddptop stopped it for the {record['ordered']} alert"
    elif record.get("rank") is not None and record.get("exitcode") is not None:
        verb = "failed with" if record["exitcode"] >= 0 else "was"
        text += f" after rank {record['rank']} {verb} {exit_reason(record['exitcode'])}"
    if record.get("backoff_s"):
        text += f", in {record['backoff_s']:g} s"
    return text
