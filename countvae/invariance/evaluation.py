"""What the invariance checks read: a model on the evaluated cells, each estimate computed once.

:func:`countvae.invariance.verify` compares a model with its reparameterization
by a latent map. Several checks need the same expensive numbers (the
importance-sampling ``log p(x)`` at a seed, exact quadrature, the model's
outputs); an :class:`EvaluatedModel` computes each on first use and keeps it, so
every check can ask for what it needs without knowing who else does. Every
estimate draws from its own seeded generator, so the order in which checks ask
does not change any number.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
import torch

from countvae._checks import check_choice, check_int, check_number
from countvae.invariance.elbo_geometry import refit_mean_field_elbo
from countvae.invariance.outputs import ModelOutputs, distance_subset, log_normalized_counts, model_outputs
from countvae.invariance.quadrature import quadrature_log_marginal, quadrature_unsupported_reason
from countvae.model import CountVAE, ModelCells, inference

#: Label of the model passed to :func:`countvae.invariance.verify` among the evaluated variants.
FITTED = "fitted"

_DTYPE_NAMES = {torch.float64: "float64", torch.float32: "float32"}


@dataclass(frozen=True)
class VerifySettings:
    """The settings of :func:`countvae.invariance.verify` (documented there), checked when created."""

    n_samples: int = 500
    seed: int = 0
    dtype: torch.dtype = torch.float64
    controls: bool = True
    prior_controls: bool = True
    quadrature: bool | Literal["auto"] = "auto"
    n_nodes: int = 20
    n_pointwise: int = 8
    n_elbo_samples: int = 64
    elbo_cells: int = 200
    elbo_refit_steps: int = 200
    k_neighbors: int = 15
    z_threshold: float = 5.0
    change_threshold: float = 3.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every setting.

        Raises
        ------
        InvalidArgumentError
            Naming the first setting that is out of range.

        """
        for name, low in (
            ("n_samples", 2),
            ("n_nodes", 2),
            ("n_pointwise", 1),
            ("n_elbo_samples", 2),
            ("elbo_cells", 1),
            ("elbo_refit_steps", 0),
            ("k_neighbors", 1),
        ):
            object.__setattr__(self, name, check_int(name, getattr(self, name), low))
        object.__setattr__(self, "seed", check_int("seed", self.seed, 0))
        check_choice("dtype", self.dtype, tuple(_DTYPE_NAMES))
        check_choice("quadrature", self.quadrature, (True, False, "auto"))
        object.__setattr__(self, "z_threshold", check_number("z_threshold", self.z_threshold, 0.0, low_open=True))
        object.__setattr__(
            self, "change_threshold", check_number("change_threshold", self.change_threshold, 0.0, low_open=True)
        )

    @property
    def dtype_name(self) -> str:
        """``"float64"`` or ``"float32"``."""
        return _DTYPE_NAMES[self.dtype]

    @property
    def tolerances(self) -> dict[str, float]:
        """Equality tolerances: absolute plus relative to the size of the compared log densities."""
        if self.dtype == torch.float64:
            return {"abs": 1e-9, "rel": 0.0, "quad_abs": 1e-10, "quad_rel": 1e-13, "output": 1e-9}
        return {"abs": 1e-4, "rel": 2e-5, "quad_abs": 1e-4, "quad_rel": 2e-5, "output": 1e-4}


class EvaluationCells:
    """The evaluated cells and the fixed subsets some checks use (all determined by the cells and the seed)."""

    def __init__(self, cells: ModelCells, settings: VerifySettings):
        self.cells = cells
        self.settings = settings

    @property
    def source(self):
        """The :class:`countvae.data.CountSource` of the cells."""
        return self.cells.source

    @property
    def indices(self) -> np.ndarray:
        """Positions of the evaluated cells."""
        return self.cells.indices

    @functools.cached_property
    def log_expression(self) -> np.ndarray:
        """``log1p`` of normalized observed counts, (cells, genes) (for gene correlations)."""
        return log_normalized_counts(self.source, self.indices)

    @functools.cached_property
    def distance_subset(self) -> np.ndarray:
        """Positions (among the evaluated cells) used for pairwise distances and neighbour graphs."""
        return distance_subset(len(self.indices), self.settings.seed)

    @functools.cached_property
    def elbo_indices(self) -> np.ndarray:
        """A seeded random subset of ``elbo_cells`` cells for the ELBO comparisons (cell positions)."""
        chosen = np.random.default_rng(self.settings.seed).permutation(len(self.indices))[: self.settings.elbo_cells]
        return self.indices[np.sort(chosen)]


class EvaluatedModel:
    """A model on the evaluated cells; each estimate is computed on first use and kept.

    Parameters
    ----------
    model
        The model (already in the evaluation dtype).
    cells
        The evaluated cells.
    use_quadrature
        Whether exact quadrature is wanted at all (it is computed only where the model qualifies).

    """

    def __init__(self, model: CountVAE, cells: EvaluationCells, use_quadrature: bool):
        self.model = model
        self.cells = cells
        self.use_quadrature = use_quadrature
        self._lpd: dict[tuple[int, str], pd.DataFrame] = {}

    @property
    def settings(self) -> VerifySettings:
        """The verification settings."""
        return self.cells.settings

    def lpd(self, seed: int, method: str = "guide") -> pd.DataFrame:
        """Importance-sampled ``log p(x)`` per cell (``n_samples`` draws) at ``seed``.

        ``method="guide"`` draws ``z = loc + scale @ eps`` with ``eps`` from the seed, so two
        models at one seed share their base noise (the common-random-number check);
        ``method="mixture"`` is the package's default estimator, with proposals built
        from this model alone (:mod:`countvae.module.marginal`).
        """
        key = (seed, method)
        if key not in self._lpd:
            self._lpd[key] = inference.log_predictive_density(
                self.model.module, self.cells.source, self.cells.indices, self.settings.n_samples, seed, method=method
            )
        return self._lpd[key]

    @functools.cached_property
    def quadrature(self) -> np.ndarray | None:
        """Exact ``log p(x)`` per cell, or ``None`` when not wanted or the model does not qualify."""
        if not self.use_quadrature or quadrature_unsupported_reason(self.model) is not None:
            return None
        return quadrature_log_marginal(self.model, self.cells.cells.adata, self.cells.indices, self.settings.n_nodes)

    @functools.cached_property
    def outputs(self) -> ModelOutputs:
        """The model's outputs on the cells (latents, expression, loadings, distances, neighbours)."""
        c = self.cells
        return model_outputs(
            self.model, c.source, c.indices, c.log_expression, c.distance_subset, self.settings.k_neighbors
        )

    @functools.cached_property
    def refit_elbo(self) -> tuple[np.ndarray, np.ndarray]:
        """ELBO of each ELBO cell's best mean-field guide and its Monte Carlo standard error."""
        s = self.settings
        return refit_mean_field_elbo(
            self.model, self.cells.source, self.cells.elbo_indices, s.elbo_refit_steps, seed=s.seed
        )


@dataclass
class MapComparison:
    """A model and its reparameterization by one latent map, as the checks see them.

    Attributes
    ----------
    variant
        Label of the original model (:data:`FITTED` or a prior control).
    name
        Name of the map.
    kind
        What kind of map it is (:func:`countvae.invariance.transforms.classify`).
    invariant
        Whether the theory says ``p(x)`` is unchanged (the map preserves the prior on ``z``).
    original, transformed
        The two models on the evaluated cells.
    A
        The map relating their latents, ``z' = A z`` (as applied, after any polar correction).
    loadings_invariant
        With a prior on the loadings: whether the map preserves it (then ``log p(W)``
        is unchanged); ``None`` without one.

    """

    variant: str
    name: str
    kind: str
    invariant: bool
    original: EvaluatedModel
    transformed: EvaluatedModel
    A: np.ndarray
    loadings_invariant: bool | None = None

    @property
    def orthogonal(self) -> bool:
        """Whether ``A`` is orthogonal."""
        return self.kind != "linear"

    @property
    def settings(self) -> VerifySettings:
        """The verification settings."""
        return self.original.settings
