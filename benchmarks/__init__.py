"""The asv suite (``asv.conf.json``: ``benchmark_dir = benchmarks``).

Under asv (which sets ``ASV=true``), BLAS/OpenMP pools are pinned to one thread before torch
or numpy is imported, as projects that gate on asv do: a 2-core runner with oversubscribed
thread pools measures the scheduler, not the code. ``asv.conf.json`` pins the same variables
for its virtualenvs; an explicit value in the environment wins. Importing the suite anywhere
else (the tests) changes nothing.
"""

import os

if os.environ.get("ASV") == "true":
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_var, "1")
