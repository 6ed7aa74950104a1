"""ClientApp: fedsl's client update (LocalSGD) on the node's partition (node config partition-id)."""

from pathlib import Path

from fedsl.flower import make_client_app

app = make_client_app(app_dir=Path(__file__).resolve().parent.parent)
