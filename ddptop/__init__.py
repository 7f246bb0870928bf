"""ddptop: top for PyTorch DistributedDataParallel jobs, and their supervisor.

The code lives in the top-level folders core/, supervisor/, trainer/ and
tui/; this folder is the package, and ddptop/core, ddptop/supervisor,
ddptop/trainer and ddptop/tui are relative links to them, so that Python,
the build, mypy, import-linter and an editor all read one package from the
checkout as it is. Its own modules are the `ddptop` command (cli.py), the
one place that joins the supervisor and the dashboard.
"""

__version__ = "0.1.0"
