"""`python -m kevin_cli ...`: the same as the `kevin` console script (the DVC stages call it through scripts/kevin)."""

from __future__ import annotations

import sys

from kevin_cli.app import main

if __name__ == "__main__":
    sys.exit(main())
