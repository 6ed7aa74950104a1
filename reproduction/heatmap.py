"""Draw a collected two-key sweep's heat maps into its folder (fedsl.report.report.write_heatmaps).

    python reproduction/heatmap.py reproduction/NAME "TITLE"

One panel per method in the group's order, its first swept key down (Fig. 5: η_l), its second across
(C), the final accuracy (mean over seeds, 3 decimals) in each cell: reproduction/NAME/heatmap.png.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fedsl.report.report import write_heatmaps

if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__.strip().splitlines()[2].strip())
    folder = Path(sys.argv[1])
    print(write_heatmaps(folder, folder / "heatmap.png", sys.argv[2] if len(sys.argv) == 3 else ""))
