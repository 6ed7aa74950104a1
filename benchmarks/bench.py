"""fedsl's engine vs a plain PyTorch loop vs Flower's and pfl-research's simulations, on the paper's workloads.

    python benchmarks/bench.py                       # everything on the CPU (~15 min on 2 cores)
    python benchmarks/bench.py --workloads s2-cifar10+eval --reps 5
    PYTHONPATH=src python3 benchmarks/bench.py --device cuda   # GPU machine, only torch + numpy needed
    python benchmarks/bench.py --smoke               # tiny: checks the harness (CI)

The harness lives beside this script in ``benchmarks/harness/`` (not in the library); see its
``__init__`` for what is measured and how.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # the harness package next to this script
try:
    import fedsl  # noqa: F401
except ImportError:  # not installed: use the source tree next to this script
    sys.path.insert(0, os.path.join(HERE, "..", "src"))

from harness.command import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
