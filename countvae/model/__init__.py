"""The user-facing model class, its settings, and the functions it delegates to."""

from countvae.model.countvae import CountVAE, copy_model
from countvae.model.query import ModelCells
from countvae.model.settings import DataSummary, ModelSettings
from countvae.model.training import TrainingPlan
from countvae.model.warmup import TrainingTimeEstimate, estimate_training_time

__all__ = [
    "CountVAE",
    "DataSummary",
    "ModelCells",
    "ModelSettings",
    "TrainingPlan",
    "TrainingTimeEstimate",
    "copy_model",
    "estimate_training_time",
]
