"""fedsl data: list, show, prepare, synth, partition."""

import numpy as np

from fedsl.cli import main
from fedsl.sources.image_folder import load_image_folder


def test_data_list_shows_where_datasets_are(shared_data, capsys):
    assert main(["data", "list", "--data-dir", str(shared_data)]) == 0
    out = capsys.readouterr().out
    assert "cifar10-jpeg" in out and "stl10-subset" in out and "not found" in out  # mnist is absent


def test_data_show_counts_and_contact_sheet(tmp_path, capsys):
    png = tmp_path / "sheet.png"
    assert main(["data", "show", "synthetic_chars", "--out", str(png)]) == 0
    out = capsys.readouterr().out
    assert "2000 train / 1000 test" in out and png.stat().st_size > 5_000


def test_data_pictures_go_where_asked_or_under_runs(tmp_path, monkeypatch, capsys):
    """`fedsl data show` and `fedsl data partition` write their PNG where --out says (its folder made), else a
    file of their own under runs/, as `fedsl run` does: never a contact-sheet.png or partition.png dropped into the
    working directory."""
    monkeypatch.chdir(tmp_path)
    assert main(["data", "show", "toy"]) == 0
    assert main(["data", "partition", "--preset", "quickstart", "--set", "data.dataset='toy'",
                 "--set", "data.num_clients=8", "--set", "data.server_size=8"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["runs"]
    pictures = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(pictures) == 2 and pictures[0].startswith("quickstart-partition-") and \
        pictures[1].startswith("toy-samples-") and all(p.endswith(".png") for p in pictures)
    out = capsys.readouterr().out
    assert f"samples: runs/{pictures[1]}" in out and f"heat map: runs/{pictures[0]}" in out
    assert main(["data", "show", "toy", "--out", str(tmp_path / "pictures" / "toy.png")]) == 0
    assert (tmp_path / "pictures" / "toy.png").stat().st_size > 1_000


def test_data_prepare_decodes_and_caches(shared_data, capsys):
    assert main(["data", "prepare", "cifar10", "--data-dir", str(shared_data)]) == 0
    assert "50000 train, 10000 test, 10 classes" in capsys.readouterr().out


def test_synth_folder_round_trips_as_server_data(tmp_path, capsys):
    out = tmp_path / "chars"
    assert main(["data", "synth", "--chars", "0123aA", "--per-class", "4", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["0", "1", "2", "3", "A", "a_lower"]
    s = load_image_folder(out, class_names=list("0123aA"), aliases={"a_lower": "a"}, mode="L")
    assert s.x.shape == (24, 28, 28) and np.bincount(s.y).tolist() == [4] * 6
    assert main(["data", "synth", "--fslsyn", "--chars", "01", "--out", str(tmp_path / "fs")]) == 0
    assert len(list((tmp_path / "fs" / "0").iterdir())) == 15


def test_data_partition_prints_histograms_and_heat_map(tmp_path, capsys):
    png = tmp_path / "p.png"
    assert main(["data", "partition", "--preset", "quickstart", "--set", "data.partition='dirichlet'",
                 "--set", "data.dirichlet_alpha=0.3", "--out", str(png)]) == 0
    out = capsys.readouterr().out
    assert "dirichlet partition, N=20" in out and "server" in out and png.stat().st_size > 5_000
