"""fedsl: Federated Learning with Server Learning (FSL), reference implementation.

The pieces, for use from Python (the ``fedsl`` command wraps them):

    from fedsl import Simulator, FunctionalModel, make_executor, make_algorithm
    from fedsl import LocalTraining, ServerLearning, Federation, build_model, metrics
"""

from fedsl.algorithms import (
    Algorithm,
    DifferentialPrivacy,
    LocalTraining,
    Pretraining,
    ServerLearning,
    make_algorithm,
)
from fedsl.data.federation import Federation
from fedsl.engine import metrics
from fedsl.engine.executors import make_executor
from fedsl.engine.functional import FunctionalModel
from fedsl.engine.simulator import Simulator
from fedsl.models import build_model

__version__ = "0.1.0"
__all__ = ["Algorithm", "DifferentialPrivacy", "Federation", "FunctionalModel", "LocalTraining", "Pretraining",
           "ServerLearning", "Simulator", "build_model", "make_algorithm", "make_executor", "metrics"]
