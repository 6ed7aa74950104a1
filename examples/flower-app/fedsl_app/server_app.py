"""ServerApp: holds D0 and the test set; fedsl's server update and server learning each round."""

from pathlib import Path

from fedsl.flower import make_server_app

app = make_server_app(app_dir=Path(__file__).resolve().parent.parent)
