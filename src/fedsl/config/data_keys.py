"""The config's [data] table: which dataset, how it is partitioned, the server's data D0 and U, and each dataset's
own keys (declared in ``fedsl.data.registry``: which dataset reads which key)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from fedsl.config.base import CLIENTS_MAX, PER_CLASS_MAX, SAMPLES_MAX, _Strict
from fedsl.data import registry
from fedsl.data.synthetic_fedprox import SIZE_MAX as SYNTHETIC_SIZE_MAX
from fedsl.data.synthetic_fedprox import TEST_CLIENTS as SYNTHETIC_TEST_CLIENTS
from fedsl.data.synthetic_leaf import MODEL_SEED as SYNTHETIC_MODEL_SEED

DATASETS = registry.names()  # one entry each in fedsl.data.registry.DATASETS
SERVER_DATASETS = registry.server_source_names()  # D0's other sources: fedsl.data.registry.SERVER_SOURCES
UNLABELLED_SOURCES = ("server", *SERVER_DATASETS)  # FedDF's unlabelled data: D0's images, or another source's


class DataConfig(_Strict):
    dataset: Literal[DATASETS] = Field(description="dataset name: " + ", ".join(DATASETS))
    data_dir: str | None = Field(None, description="folder with the dataset files (else env FEDSL_DATA_DIR, "
                                                   "else ~/.cache/fedsl/data); arrays: the .npz file, or a folder "
                                                   "holding arrays.npz")
    download: bool = Field(False, description="download missing publisher files (needs a network)")
    emnist_split: Literal["balanced", "bymerge", "byclass", "letters", "digits", "mnist"] = Field(
        "balanced", description="EMNIST split")
    classes: list[str] | Literal["paper45"] | None = Field(
        None, description="class subset by name (EMNIST: 'paper45' = the paper's 45 classes)")
    carve: bool = Field(False, description="carve train/test (train_per_class + test_per_class per class) out of "
                                           "the one split that exists locally, e.g. EMNIST ByMerge test")
    normalize: Literal["standardize", "unit"] = Field(
        "standardize", description="inputs: 'standardize' (pixels/255, then per-channel mean and std of the "
                                   "training split, for clients, D0 and test set alike; arrays: each feature's mean "
                                   "and std, axis 1) or 'unit' (pixels/255 only; arrays: the features as given)")
    carve_test: Literal["up_to", "exact"] = Field(
        "up_to", description="carving: a class short of train_per_class + test_per_class gives the test set what "
                             "is left after its training share ('up_to', the test size is in summary.json) or is "
                             "refused ('exact')")
    num_clients: int = Field(20, ge=1, le=CLIENTS_MAX, description=f"N, number of clients (at most {CLIENTS_MAX:,})")
    partition: Literal["classes", "iid", "dirichlet", "shards", "natural"] = Field(
        "classes", description="'classes' (paper: C classes per client), 'iid', 'dirichlet', 'shards' or 'natural' "
                               "(one client per id of the files: LEAF's users, data.id_column of hf_files; "
                               "data.num_clients = N keeps the first N ids, sorted)")
    classes_per_client: int = Field(2, ge=1, le=10_000, description="C, label classes per client (at most 10,000)")
    samples_per_client: int | None = Field(None, ge=1, le=SAMPLES_MAX, description="n_i; default: the pool split "
                                                                                    "evenly over N (at most 10^7)")
    dirichlet_alpha: float = Field(0.5, gt=0, description="α of the Dirichlet label-skew partition")
    shards_per_client: int = Field(2, ge=1, le=10_000, description="shards per client (McMahan et al. partition; "
                                                                     "at most 10,000)")
    quantity_skew: float | None = Field(None, gt=0, description="β: IID labels, client sizes ∝ Dirichlet(β)")
    server_source: Literal["iid", "clients", "dataset", "other_ids"] = Field(
        "iid", description="D0 from: 'iid' training samples, 'clients' (c clients × s samples), another 'dataset', "
                           "or 'other_ids' (natural partition: the training samples of the c = data.server_clients "
                           "ids after the N clients', ids that are not clients)")
    server_size: int = Field(0, ge=0, le=SAMPLES_MAX, description="n0 = |D0| (iid: ≈ n0/L per class; other sources: "
                                                                    "a size budget, 0 = all they give; at most 10^7)")
    server_overlap: bool = Field(True, description="iid D0 drawn from the whole pool (paper) or disjoint from clients")
    server_clients: int = Field(10, ge=1, le=CLIENTS_MAX, description="c, clients the server takes samples from "
                                                                        f"(paper Scenario 2; at most {CLIENTS_MAX:,})")
    server_samples_per_client: int = Field(50, ge=1, le=PER_CLASS_MAX, description="s, samples taken from each of "
                                                                                     "the c clients (at most 10^6)")
    server_dataset: Literal[SERVER_DATASETS] = Field(
        "fslsyn", description="other-source D0: " + ", ".join(
            f"'{s.name}'" + (f" ({s.note})" if s.note else "") for s in registry.SERVER_SOURCES.values()))
    server_data_dir: str | None = Field(None, description="folder of the other-source D0 (default: data_dir; "
                                                          "server_dataset 'arrays': its .npz)")
    server_per_class: int | None = Field(None, ge=1, le=100_000, description="other-source D0: samples per class "
                                                                               "(paper FSLsyn: STL-10 56 or 80; "
                                                                               "at most 100,000)")
    unlabelled: Literal[UNLABELLED_SOURCES] = Field(
        "server", description="the server's unlabelled data U that FedDF distils on (labels, if any, never read): "
                              "'server' = D0's images, or another source of data.server_dataset's list (e.g. 'stl10', "
                              "or 'stl10_unlabelled': STL-10's 100,000 unlabelled images), appended to the pool")
    unlabelled_size: int = Field(0, ge=0, le=SAMPLES_MAX, description="|U|: that many of data.unlabelled's images, "
                                 "drawn once from the seed (0 = all; at most 10^7)")
    test_size: int | None = Field(None, ge=1, le=SAMPLES_MAX, description="evaluate on this many test samples: a "
                                  "class-balanced subset drawn once, the same for every run and seed (quick looks, "
                                  "quick forms); default: the whole test split, as the paper")
    validation: float = Field(0.0, ge=0, lt=1, description="fraction of each client's training samples held out as "
                              "the validation set (0 = none): pooled, evaluated beside the test set, never trained on")
    # local files read with Hugging Face datasets (fedsl.sources.hf_files)
    id_column: str | None = Field(None, min_length=1, description="hf_files: the column of each sample's natural id "
                                  "(writer, user, device) that data.partition = 'natural' makes one client each")
    label_column: str = Field("label", min_length=1, description="hf_files: the column of the class labels")
    test_fraction: float = Field(0.1, gt=0, lt=1, description="hf_files without a test split: the fraction of each "
                                 "id's samples held out as its test samples (⌊f·n_u⌋, drawn once, seed-free); "
                                 "shakespeare: each role's last windows (LEAF's 1 − tf; the FedAvg paper 0.2)")
    # Shakespeare by speaking role (fedsl.sources.shakespeare)
    text: Literal["works", "tiny"] = Field("works", description="shakespeare: 'works' (Project Gutenberg's etext "
                                           "#100 or its first part: one client per (play, role), LEAF's) or 'tiny' "
                                           "(tinyshakespeare.txt: one client per speaker)")
    seq_length: int = Field(80, ge=1, le=10_000, description="shakespeare: L, characters per sample's window "
                                                             "(LEAF, FedAvg paper: 80)")
    stride: int = Field(1, ge=1, le=10_000, description="shakespeare: keep every s-th window of a line (1: every "
                                                        "window, LEAF's; larger bounds their overlap)")
    min_samples: int = Field(64, ge=1, le=SAMPLES_MAX, description="shakespeare: a role with fewer windows is "
                                                                   "dropped (LEAF's -k)")
    # font-rendered characters (fedsl.sources.synthetic)
    chars: str = Field("0123456789", min_length=2, description="characters (classes) of synthetic_chars")
    train_per_class: int = Field(200, ge=1, le=PER_CLASS_MAX, description="training images per class (synthetic_chars, "
                                                                            "carve; at most 10^6; synthetic_chars: "
                                                                            "len(chars) × (train + test) at most 10^6)")
    test_per_class: int = Field(100, ge=1, le=PER_CLASS_MAX, description="test images per class (synthetic_chars, "
                                                                        "carve; at most 10^6)")
    # Synthetic(α, β) of FedProx (fedsl.data.synthetic_fedprox)
    synthetic_alpha: float = Field(1.0, ge=0, le=100, description="α of synthetic_fedprox's Synthetic(α, β): u_k ~ "
                                   "N(0, α²), the mean of the clients' W_k, b_k (FedProx: 0, 0.5, 1; it shifts every "
                                   "class's logit alike, so it changes no label, as in the authors' generator)")
    synthetic_beta: float = Field(1.0, ge=0, le=100, description="β of synthetic_fedprox's Synthetic(α, β): how much "
                                  "the clients' inputs differ (B_k ~ N(0, β²))")
    synthetic_max_samples: int = Field(SYNTHETIC_SIZE_MAX, ge=2, le=SAMPLES_MAX, description="synthetic_fedprox and "
                                       "synthetic_leaf: cap on a client's n_k (⌊lognormal(4, 2)⌋ + 50, LEAF's "
                                       "⌊lognormal(3, 2)⌋ + 5), the first ⌊0.9·n_k⌋ its training "
                                       "data (LEAF's cap 1,000; at most 10^7)")
    synthetic_test_clients: int = Field(SYNTHETIC_TEST_CLIENTS, ge=1, le=CLIENTS_MAX, description="synthetic_fedprox "
                                        "and synthetic_leaf: the test set is the held-out samples of this many "
                                        "clients drawn once (all N when N is not larger)")
    synthetic_server_alpha: float | None = Field(None, ge=0, le=100, description="synthetic_fedprox: α0, D0 (iid) "
                                                 "drawn through the prior (α0, β0), a shifted D0 (default α: none; "
                                                 "α0 changes no label: β0 shifts)")
    synthetic_server_beta: float | None = Field(None, ge=0, le=100, description="synthetic_fedprox: β0 of the "
                                                "shifted D0's prior (default β: none)")
    # LEAF's synthetic data (fedsl.data.synthetic_leaf); synthetic_alpha and synthetic_beta are not read there (a
    # changed one is refused, as every dataset-specific key with a dataset that does not read it)
    synthetic_clusters: list[Annotated[float, Field(gt=0, le=1)]] | None = Field(
        None, min_length=1, max_length=100, description="synthetic_leaf: the probabilities of its clusters of client "
        "models, summing to 1 (LEAF's prob_clusters; default [1.0], one cluster, as LEAF)")
    synthetic_model_seed: int = Field(SYNTHETIC_MODEL_SEED, ge=0, le=2**63 - 1, description="synthetic_leaf: the seed "
                                      "of the structure the clients' models share (Q, the clusters' centres): one "
                                      "benchmark instance for every run seed, as LEAF's generated files are one "
                                      "(default 931,231, LEAF's default seed); the run's seed draws the clients")

    @model_validator(mode="after")
    def _checks(self) -> "DataConfig":
        if len(set(self.chars)) != len(self.chars):
            raise ValueError(f"data.chars = {self.chars!r}: expected distinct characters")
        if isinstance(self.classes, list) and len(set(self.classes)) != len(self.classes):
            raise ValueError(f"data.classes = {self.classes!r}: expected distinct class names")
        if self.classes == "paper45" and self.dataset != "emnist":
            raise ValueError(f"data.classes = 'paper45' is for dataset 'emnist', not {self.dataset!r}")
        if self.partition == "natural" and not registry.DATASETS[self.dataset].natural:
            raise ValueError(f"data.partition = 'natural' needs an id per sample: expected data.dataset "
                             f"{' or '.join(repr(n) for n, i in registry.DATASETS.items() if i.natural)}, "
                             f"not {self.dataset!r}")
        if self.partition == "natural" and self.samples_per_client is not None:
            raise ValueError(f"data.samples_per_client = {self.samples_per_client}: with data.partition = 'natural' "
                             "each client holds its id's samples; expected it unset")
        if self.quantity_skew is not None and self.partition != "iid":
            raise ValueError(f"data.quantity_skew = {self.quantity_skew}: only with data.partition = 'iid'")
        if self.server_source == "other_ids" and self.partition != "natural":
            raise ValueError("data.server_source = 'other_ids' takes D0 from ids that are not clients: expected "
                             f"data.partition = 'natural', not {self.partition!r}")
        if self.server_source == "dataset" and not registry.SERVER_SOURCES[self.server_dataset].labelled:
            raise ValueError(f"data.server_dataset = {self.server_dataset!r} has no labels, and D0 needs them: "
                             f"expected a labelled source, or data.unlabelled = {self.server_dataset!r} (FedDF's "
                             "unlabelled data)")
        arrays_source = [key for key, used in (("server_dataset", self.server_source == "dataset"),
                                               ("unlabelled", self.unlabelled != "server"))
                         if used and getattr(self, key) == "arrays"]
        if arrays_source and self.dataset != "arrays":
            raise ValueError(f"data.{arrays_source[0]} = 'arrays' gives features from an .npz, but data.dataset = "
                             f"{self.dataset!r} gives images or text: expected data.dataset = 'arrays'")
        if self.synthetic_clusters is not None and abs(sum(self.synthetic_clusters) - 1) > 1e-6:
            raise ValueError(f"data.synthetic_clusters = {self.synthetic_clusters}: expected probabilities summing "
                             "to 1")
        check = registry.DATASETS[self.dataset].check_config  # the dataset's own rules (synthetic_chars: its size)
        problem = check(self) if check is not None else None
        if problem:
            raise ValueError(problem)
        return self

    @property
    def has_server_data(self) -> bool:
        return self.server_source != "iid" or self.server_size > 0

    @property
    def has_unlabelled_data(self) -> bool:
        """The server has unlabelled data U: D0's images, or another source's."""
        return self.unlabelled != "server" or self.has_server_data

