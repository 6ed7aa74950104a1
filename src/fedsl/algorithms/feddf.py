"""FedDF (Lin, Kong, Stich & Jaggi, "Ensemble Distillation for Robust Model Fusion in Federated Learning",
NeurIPS 2020): FedAvg whose server then distils the ensemble of the round's client models into the average.

    x̄_t     = x_t + η_g · mean_i Δ_i        FedAvg (lines 8-9) with η_g = 1: the average of the client models
    x̄_t'    = distil {x_i} into x̄_t on U    Adam on KL(ensemble ‖ student) over unlabelled server data U
    x_{t+1} = LocalSGD(x̄_t', γ·η0, K0, D0)  line 10, only with ``server.learning = 'incremental'`` (FedDF + FSL)

The distillation, its settings (the config's ``[distill]`` table) and which of them are the paper's, the authors'
code's or ours: ``distillation``. U is the server's unlabelled data (``data.unlabelled``: D0's images with their
labels ignored, or another source's images, STL-10's unlabelled split among them); the labels of D0 are read only
by server learning after the distillation (FedDF + FSL: distillation on the unlabelled part, then FSL's steps on the
labelled D0), which composes as it does with every rule.

The server reads every client's model, not only their mean: the robust rules and DP-FedAvg, which replace those
models by a robust or private aggregate, do not compose with it (config validation refuses them), nor does secure
aggregation, which hides them.
"""

from __future__ import annotations

from fedsl.algorithms.fedavg import FedAvg
from fedsl.algorithms.spec import Spec

# FedDF's start is the average of the client models, η_g = 1 (the paper's x_{t,0} = Σ_k (n_k/n) x̂_t^k; the n_k
# weighting with algorithm.weighted = true). Its clients are FedAvg's: any Flower client runs them.
SPEC = Spec("feddf", FedAvg, global_lr=1.0, distills=True, title="FedDF",
            secagg_refused="distils the ensemble of the round's individual client models on the server",
            summary="FedDF: the average of the client models, then distilled from their ensemble on unlabelled "
                    "server data")
