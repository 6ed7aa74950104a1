"""summary.json records the server data D0 a run reads, and only that: SCAFFOLD beside FSL in one config draws the
same D0 but never reads it, so its summary.json says size 0 (and how large the unused draw was)."""

import json

from conftest import tiny_config

from fedsl.config import schema as C
from fedsl.sweeps.compare import run_group


def test_a_run_that_does_not_read_d0_records_none(tmp_path):
    variants = {"FSL": {}, "SCAFFOLD": {"algorithm": {"name": "scaffold"}}, "FedAvg+FT": {
        "algorithm": {"name": "fedavg"}, "server": {"finetune_epochs": 1}}}
    cfg = C.validate(tiny_config(rounds=2, variants=variants))
    run_group(cfg, tmp_path / "g", log=lambda s: None, progress=False)
    read = {v: json.loads((tmp_path / "g" / v / "summary.json").read_text())["server_data"] for v in variants}
    assert read["FSL"]["size"] == 12 and sum(read["FSL"]["class_histogram"]) == 12  # server learning reads D0
    assert read["FedAvg+FT"]["size"] == 12  # FedAvg fine-tuned on D0 after its last round reads it too
    assert read["SCAFFOLD"] == {"size": 0, "class_histogram": [], "drawn_unused": 12}
