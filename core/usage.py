"""Bad input on the command line, said in one line with exit status 2.

Every `ddptop` command checks its input before it starts anything, so a
mistake never leaves a process behind; these two are how it says so.
"""

from __future__ import annotations

import argparse


class UsageError(Exception):
    """Bad input on the command line: reported in one line, exit status 2."""


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a mistake as UsageError, not usage text and exit."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)
