"""ddptop: top for PyTorch DistributedDataParallel jobs, and their supervisor.

The code lives in the top-level folders supervisor/, trainer/ and tui/, installed
as ddptop.supervisor, ddptop.trainer and ddptop.tui; this package only joins them.
"""

__version__ = "0.1.0"
