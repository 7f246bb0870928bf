"""`python -m ddptop`, as the `ddptop` command."""

import sys

from ddptop.cli import main

if __name__ == "__main__":
    sys.exit(main())
