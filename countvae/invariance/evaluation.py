"""What the invariance checks read: a model on the evaluated cells, each estimate computed once.

:func:`countvae.invariance.verify` compares a model with its reparameterization by a latent map. Several checks need
the same expensive numbers (``log p(x)`` by importance sampling with the guide as proposal at a seed, for the
common-random-number check; by the package's estimator at a seed, started from the guide or from the prior alone;
exact quadrature on an axis-aligned grid; the model's outputs); an :class:`EvaluatedModel` computes each on first use
and keeps it, so every check asks for what it needs without knowing who else does. Every estimate draws from its own
seeded generator, so the order of the requests changes no number.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import pandas as pd
import torch

from countvae._checks import check_bool, check_choice, check_int, check_number
from countvae._settings import documents_settings, setting
from countvae.errors import InvalidArgumentError, UnreliableEstimateWarning
from countvae.invariance.elbo_geometry import refit_mean_field_elbo
from countvae.invariance.grid_quadrature import GridQuadrature, grid_quadrature
from countvae.invariance.outputs import ModelOutputs, distance_subset, log_normalized_counts, model_outputs
from countvae.invariance.quadrature import quadrature_unsupported_reason
from countvae.model import CountVAE, ModelCells, inference
from countvae.model.training import to_tensors
from countvae.module.importance import MAX_UNRELIABLE_SHARE, MIN_ESS, ImportanceSummary
from countvae.module.marginal import MarginalSettings

#: Where the estimator's proposal starts: the model's guide, or the prior alone.
Start = Literal["guide", "prior"]

#: Label of the model passed to :func:`countvae.invariance.verify` among the evaluated variants.
FITTED = "fitted"

_DTYPE_NAMES = {torch.float64: "float64", torch.float32: "float32"}

#: Cells handed to the estimator at once (as in :func:`countvae.model.inference.log_predictive_density`).
CELLS_PER_CHUNK = 128

#: Largest number of (draw x cell x gene) elements the estimator evaluates at once.
ELEMENTS_PER_CHUNK = 2**22


@documents_settings()
@dataclass(frozen=True)
class VerifySettings:
    """The settings of :func:`countvae.invariance.verify`, checked when created.

    Each field is declared once here, with its description; ``verify`` takes the
    fields as keywords (or all of them as ``settings=VerifySettings(...)``), and its
    signature and "Parameters" section are generated from them (``countvae._settings``).

    Attributes
    ----------
    {settings}

    """

    n_samples: int = setting(
        500,
        """Importance draws per cell: of the guide proposal for the common-random-number check, and the final draws
        of the package's estimator (:func:`countvae.module.marginal.estimate_log_marginal`) for the other checks.""",
    )
    seed: int = setting(
        0,
        """Seed of everything random: default maps, the common base noise and the original model's estimate
        (``seed``), the transformed model's independent estimate (``seed + 1``), its estimate from its own proposal
        (``seed + 2``), pointwise and ELBO draws.""",
    )
    dtype: torch.dtype = setting(
        torch.float64,
        """Precision of the evaluation; ``torch.float64`` makes the common-random-number difference a rounding error
        (at most 1e-9 nats); with ``torch.float32`` it is reported against a tolerance of 1e-4 + 2e-5 |log p(x)|.""",
    )
    controls: bool = setting(True, "Add the non-orthogonal controls of :func:`countvae.invariance.control_transforms`.")
    prior_controls: bool = setting(
        True,
        """Also evaluate the same networks with the priors the model does not have (``"laplace"``; ``"diagonal"``
        with scales 0.5..2) under a rotation (must change ``p(x)``) and a map of that prior's own group (must not).
        Needs ``n_latent >= 2``.""",
    )
    quadrature: bool | Literal["auto"] = setting(
        "auto",
        """Compare exact ``log p(x)`` by quadrature on axis-aligned grids
        (:func:`countvae.invariance.grid_quadrature`): ``"auto"`` when the model qualifies (linear decoder, Poisson
        or NB, ``n_latent <= 3``), ``True`` to require it, ``False`` to skip it.""",
    )
    quadrature_tolerance: float = setting(
        1e-8, "Nodes per axis are doubled until ``log p(x)`` changes by less than this (nats)."
    )
    quadrature_max_nodes: int = setting(
        257, """Node budget per axis; a cell that reaches it unconverged makes the result "not verified"."""
    )
    n_pointwise: int = setting(8, "Posterior draws per cell for the pointwise comparison.")
    n_elbo_samples: int = setting(64, "Draws per cell for the ELBO with the projected mean-field guide.")
    elbo_cells: int = setting(200, "Cells (a seeded random subset) used for the ELBO comparisons.")
    elbo_refit_steps: int = setting(
        200,
        """Adam steps of the per-cell refit of the best mean-field guide in each model's coordinates
        (:func:`countvae.invariance.elbo_geometry.refit_mean_field_elbo`); 0 skips the refit.""",
    )
    k_neighbors: int = setting(15, "Neighbours in the latent k-NN graph.")
    z_threshold: float = setting(
        5.0,
        """Largest ``|z|`` of the mean difference of two independent estimates, in units of its reported standard
        error, accepted as equal for a map that preserves the prior.""",
    )
    change_threshold: float = setting(
        4.0,
        """A control counts as detected when the standardized chi-square of the per-cell changes of ``log p(x)`` in
        their reported standard errors, ``(sum (d_i / s_i)^2 - n) / sqrt(2 n)`` (about 0 without a change), exceeds
        this.""",
    )
    max_unreliable_fraction: float = setting(
        MAX_UNRELIABLE_SHARE,
        """Largest share of cells whose estimate may be unreliable (k-hat above 0.7 or ESS below ``min_ess``), or
        outside 3 (against quadrature) or 4 (between two estimates) reported standard errors.""",
    )
    min_ess: float = setting(MIN_ESS, "Smallest effective sample size of a reliable estimate.")
    max_estimator_error: float = setting(
        0.05, "Largest mean absolute error of the estimator against exact quadrature (nats per cell)."
    )
    estimator_settings: MarginalSettings | None = setting(
        None,
        """Settings of the package's estimator (default: its default for the model,
        :func:`countvae.model.inference.default_marginal_settings`, with ``n_samples`` final draws); for studying the
        checks with a weaker estimator.""",
    )

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
            ("quadrature_max_nodes", 17),
            ("n_pointwise", 1),
            ("n_elbo_samples", 2),
            ("elbo_cells", 1),
            ("elbo_refit_steps", 0),
            ("k_neighbors", 1),
            ("seed", 0),
        ):
            object.__setattr__(self, name, check_int(name, getattr(self, name), low))
        check_choice("dtype", self.dtype, tuple(_DTYPE_NAMES))
        if self.estimator_settings is not None and not isinstance(self.estimator_settings, MarginalSettings):
            raise InvalidArgumentError(
                f"estimator_settings must be a countvae.module.marginal.MarginalSettings or None, "
                f"got {type(self.estimator_settings).__name__}."
            )
        for name in ("controls", "prior_controls"):
            object.__setattr__(self, name, check_bool(name, getattr(self, name)))
        if not (isinstance(self.quadrature, str) and self.quadrature == "auto"):
            # 0 and 1 compare equal to False and True but verify reads the setting by identity: only booleans
            if not isinstance(self.quadrature, bool | np.bool_):
                raise InvalidArgumentError(f"quadrature must be True, False or 'auto', got {self.quadrature!r}.")
            object.__setattr__(self, "quadrature", bool(self.quadrature))
        for name in ("z_threshold", "change_threshold", "quadrature_tolerance", "max_estimator_error"):
            object.__setattr__(self, name, check_number(name, getattr(self, name), 0.0, low_open=True))
        for name, high in (("max_unreliable_fraction", 1.0), ("min_ess", None)):
            object.__setattr__(self, name, check_number(name, getattr(self, name), 0.0, high))

    def estimator_for(self, module) -> MarginalSettings:
        """The estimator's settings for ``module``: ``estimator_settings``, or the default its description gives."""
        if self.estimator_settings is not None:
            return self.estimator_settings
        return replace(inference.default_marginal_settings(module), n_draws=self.n_samples)

    @property
    def dtype_name(self) -> str:
        """``"float64"`` or ``"float32"``."""
        return _DTYPE_NAMES[self.dtype]

    @property
    def tolerances(self) -> dict[str, float]:
        """Equality tolerances, absolute plus relative to the size of the compared log densities."""
        if self.dtype == torch.float64:
            return {"abs": 1e-9, "rel": 0.0, "output": 1e-9}
        return {"abs": 1e-4, "rel": 2e-5, "output": 1e-4}


def prior_started_lpd(model: CountVAE, source, indices: np.ndarray, settings: MarginalSettings, seed: int):
    """``log p(x)`` per cell by :func:`countvae.module.marginal.estimate_log_marginal` with the prior as the guide.

    The estimator gets the prior ``N(0, I)`` in place of ``q(z | x)``, so nothing of the proposal comes from the
    encoder (whose rewrite under a latent map derives from the original model): Newton starts at the origin,
    the restarts (if any) are standard normal points in this model's coordinates, and the defensive component is the
    prior. Curvature: the module's Gauss-Newton :meth:`~countvae.module.vae.CountVAEModule.log_joint_neg_hessian`, as
    in :func:`countvae.model.inference.log_predictive_density`. Rows in the order of ``indices``.
    """
    module = model.module.eval()
    dtype = next(module.parameters()).dtype
    generator = torch.Generator().manual_seed(seed)
    order = np.unique(indices)
    points_per_call = max(1, ELEMENTS_PER_CHUNK // source.n_vars)
    parts = []
    for mb in source.iterate(order, CELLS_PER_CHUNK, drop_last_singleton=False):
        x, b = to_tensors(mb, dtype, model.device)
        origin = x.new_zeros(x.shape[0], module.n_latent)
        prior = (origin, torch.ones_like(origin))
        parts.append(inference.mixture_log_marginal(module, x, b, settings, generator, points_per_call, prior))
    return ImportanceSummary.concatenate(parts).take(np.searchsorted(order, indices)).to_frame()


class EvaluationCells:
    """The evaluated cells and the fixed subsets some checks use (all determined by the cells and the seed)."""

    def __init__(self, cells: ModelCells, settings: VerifySettings):
        self.cells = cells
        self.settings = settings
        self.source = cells.source  # the countvae.data.CountSource of the cells
        self.indices = cells.indices  # positions of the evaluated cells

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
        self.settings = cells.settings  # the verification settings
        self._lpd: dict[tuple[str, int], pd.DataFrame] = {}

    def guide_lpd(self, seed: int) -> pd.DataFrame:
        """``log p(x)`` per cell by importance sampling with the guide as proposal (``n_samples`` draws) at ``seed``.

        Two models evaluated at the same seed share their base noise (common random numbers): for a map that
        preserves the prior, a correct rewrite leaves every importance weight unchanged.
        """
        key = ("guide proposal", seed)
        if key not in self._lpd:
            c = self.cells
            with warnings.catch_warnings():  # its k-hat is no concern of an equality of weights
                warnings.simplefilter("ignore", UnreliableEstimateWarning)
                self._lpd[key] = inference.log_predictive_density(
                    self.model.module, c.source, c.indices, self.settings.n_samples, seed, method="guide"
                )
        return self._lpd[key]

    def lpd(self, seed: int, start: Start = "guide") -> pd.DataFrame:
        """``log p(x)`` per cell by the package's estimator at ``seed`` (columns ``lpd, mc_se, ess, khat``).

        ``start="guide"``: the estimator as every user runs it (Newton from the guide's mean, the guide in the
        defensive mixture). ``start="prior"``: the guide replaced by the prior ``N(0, I)`` (see
        :func:`prior_started_lpd`), so that the proposal is built from this model's log joint alone.
        """
        key = (f"estimator from {start}", seed)
        if key not in self._lpd:
            c, estimator = self.cells, self.settings.estimator_for(self.model.module)
            if start == "guide":
                with warnings.catch_warnings():  # the report judges the unreliable cells itself
                    warnings.simplefilter("ignore", UnreliableEstimateWarning)
                    frame = inference.log_predictive_density(
                        self.model.module, c.source, c.indices, seed=seed, settings=estimator
                    )
            else:
                frame = prior_started_lpd(self.model, c.source, c.indices, estimator, seed)
            self._lpd[key] = frame
        return self._lpd[key]

    @functools.cached_property
    def quadrature(self) -> GridQuadrature | None:
        """Exact ``log p(x)`` per cell on an axis-aligned grid (``None``: not wanted, or the model does not qualify)."""
        if not self.use_quadrature or quadrature_unsupported_reason(self.model) is not None:
            return None
        s = self.settings
        return grid_quadrature(
            self.model, self.cells.cells.adata, self.cells.indices, s.quadrature_tolerance, s.quadrature_max_nodes
        )

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
        With a prior on the loadings: whether the map preserves it (so ``log p(W)`` is unchanged); ``None`` without one.

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
