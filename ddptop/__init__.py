"""ddptop: top for PyTorch DistributedDataParallel jobs, and their supervisor.

The code lives in the top-level folders core/, supervisor/, trainer/ and
tui/, installed as ddptop.core, ddptop.supervisor, ddptop.trainer and
ddptop.tui (setup.py). This package holds the `ddptop` command (cli.py),
the one place that joins the supervisor and the dashboard.
"""

__version__ = "0.1.0"
