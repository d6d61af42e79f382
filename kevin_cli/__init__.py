"""`kevin ...`: train (the Prefect training flow), evaluate a model (the evaluation flow), evaluate kernels from the
command line, and run the suite job.

The command line sits above the library (``kevin``) and the flows (``flows``): it parses, calls them and prints,
so no library module imports it (tests/test_layers.py).

Exit codes: 0 whenever a verdict was produced (whatever it is), 2 for bad arguments or input that
is not a task/solution at all (missing file, a task without Model, ...); `validate` exits 1 when a data
check fails; `train` exits 0 when the run ends (all its steps, or stopped by a collapse alert), 1 when it fails
and 2 for a bad config; `evaluate` exits 0 when the evaluation (or comparison) is written, 1 when it fails and 2 for a
bad config or a run folder that is not a finished evaluation.
"""

from __future__ import annotations

from kevin_cli.app import app, main

__all__ = ["app", "main"]
