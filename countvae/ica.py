"""ICA axes for latent representations: whitening, then the orthogonal rotation that makes coordinates independent.

A count VAE with a N(0, I) prior fixes its latent space only up to an orthogonal map ``z -> Qz`` (see
:mod:`countvae.invariance`). Independent component analysis picks one rotation by a criterion the data can support:
the most non-Gaussian coordinates, hence (for independent non-Gaussian sources) the most independent. The choice
reproduces across fits exactly when the latent distribution is non-Gaussian along the chosen axes; for Gaussian
directions every rotation is equally good (Comon 1994) and ICA's answer is noise. :class:`ICARotation` therefore
reports each component's non-Gaussianity and warns, naming the components, when several cannot be told apart from
Gaussian noise. :func:`ica_stability` measures whether components reproduce across seeds or bootstrap resamples
(Icasso-style, Himberg et al. 2004).

What the maps preserve
----------------------
``ICARotation`` maps a latent ``z`` to sources ``s = R K (z - m)``, with ``m`` the mean, ``K`` the PCA whitening
matrix (``K Sigma K^T = I`` for the latent covariance ``Sigma``) and ``R`` orthogonal.

* Whitening (``K``) is invertible (when all components are kept) but not orthogonal unless ``Sigma`` is a multiple of
  the identity. It preserves everything invariant under invertible affine maps: linear separability of cells, linear
  and logistic-regression predictability (so InfoE, :func:`countvae.metrics.infomec`), mutual information with any
  covariate, the latent subspace as a whole. It does **not** preserve Euclidean distances, angles, k-NN graphs or the
  scale of each direction: distances after whitening are Mahalanobis distances under ``Sigma``. Small-variance
  directions (nearly collapsed latents) are blown up to unit variance.
* The rotation (``R``) is orthogonal: it preserves distances in the whitened space.
* With ``whiten=False`` the latents are only centred and the whole map is an orthogonal rotation of them: distances,
  k-NN graphs and (for a model re-expressed in these axes) ``p(x)`` are exactly preserved. This is the right choice
  when the latents are already close to white (a VAE's posterior means usually are not: their covariance is ``I``
  minus the average posterior covariance).
"""

from __future__ import annotations

import functools
import logging
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
from picard import picard
from scipy import linalg, stats
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.decomposition import FastICA
from sklearn.exceptions import ConvergenceWarning, NotFittedError

from countvae._checks import check_bool, check_choice, check_int, check_number
from countvae._warnings import warn_at_caller
from countvae.errors import InvalidArgumentError, InvalidDataError, NonIdentifiableComponentsWarning
from countvae.metrics import match_components

logger = logging.getLogger(__name__)

Algorithm = Literal["fastica", "picard"]


def _expected_logcosh_normal() -> float:
    nodes, weights = np.polynomial.hermite_e.hermegauss(100)
    return float(np.sum(weights * np.log(np.cosh(nodes))) / np.sum(weights))


#: ``E log cosh(Y)`` for ``Y ~ N(0, 1)`` (0.374567...), by 100-node Gauss-Hermite quadrature.
EXPECTED_LOGCOSH_NORMAL = _expected_logcosh_normal()

#: Cells used to simulate the Gaussian null of the negentropy (see :class:`ICARotation`).
_NULL_MAX_CELLS = 2000


def _log_cosh(x: np.ndarray) -> np.ndarray:
    # log cosh x = |x| + log1p(exp(-2|x|)) - log 2, without overflow for large |x|
    a = np.abs(x)
    return a + np.log1p(np.exp(-2.0 * a)) - np.log(2.0)


def standardize(values: np.ndarray) -> np.ndarray:
    """Columns centred and scaled to unit variance (``ddof=0``)."""
    values = np.asarray(values, dtype=np.float64)
    centred = values - values.mean(axis=0)
    return centred / centred.std(axis=0)


def excess_kurtosis(values: np.ndarray) -> np.ndarray:
    """Excess kurtosis ``E y^4 - 3`` of each standardized column (Gaussian 0, Laplace 3, uniform -1.2).

    ``scipy.stats.kurtosis`` with Fisher's definition and the plain moment estimator (``bias=True``).
    """
    return stats.kurtosis(np.asarray(values, dtype=np.float64), axis=0, fisher=True, bias=True)


def skewness(values: np.ndarray) -> np.ndarray:
    """Skewness ``E y^3`` of each standardized column (``scipy.stats.skew`` with ``bias=True``)."""
    return stats.skew(np.asarray(values, dtype=np.float64), axis=0, bias=True)


def negentropy(values: np.ndarray) -> np.ndarray:
    """Hyvarinen's log-cosh approximation of each standardized column's negentropy.

    ``J(y) ~ (E log cosh y - E log cosh N(0, 1))^2`` (Hyvarinen 1998), up to a positive constant; 0 for a Gaussian.
    About 1.3e-3 for a Laplace and 7.2e-4 for a uniform variable (by quadrature); a sample of ``n`` Gaussian values
    gives about ``0.006 / n`` (and ICA, which maximises it over directions, finds more).
    """
    return (np.mean(_log_cosh(standardize(values)), axis=0) - EXPECTED_LOGCOSH_NORMAL) ** 2


def _check_latents(latents: Any, name: str = "latents") -> np.ndarray:
    try:
        z = np.asarray(latents, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidDataError(f"{name} must be a numeric (cells, dimensions) array.") from None
    if z.ndim != 2 or z.shape[1] == 0:
        raise InvalidDataError(f"{name} must be 2-dimensional (cells, dimensions), got shape {z.shape}.")
    if not np.all(np.isfinite(z)):
        raise InvalidDataError(f"{name} contains NaN or infinite values; remove those cells first.")
    if z.shape[0] < z.shape[1] + 2:
        raise InvalidDataError(f"{name} has {z.shape[0]} cells for {z.shape[1]} dimensions; ICA needs many more cells.")
    return z


def _finite_matrix(values: Any, name: str, width: int) -> np.ndarray:
    """``values`` as a finite float64 (cells, ``width``) array, for the maps of a fitted :class:`ICARotation`."""
    try:
        x = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidDataError(f"{name} must be a numeric (cells, {width}) array.") from None
    if x.ndim != 2 or x.shape[1] != width:
        raise InvalidDataError(f"Expected {name} of shape (cells, {width}), got {x.shape}.")
    if not np.all(np.isfinite(x)):
        raise InvalidDataError(f"{name} contains NaN or infinite values; remove those cells first.")
    return x


def _fastica_rotation(white: np.ndarray, random_state: int, max_iter: int, tol: float) -> tuple[np.ndarray, int]:
    ica = FastICA(
        whiten=False, fun="logcosh", algorithm="parallel", max_iter=max_iter, tol=tol, random_state=random_state
    )
    ica.fit(white)
    return ica.components_, int(ica.n_iter_)


def _picard_rotation(white: np.ndarray, random_state: int, max_iter: int, tol: float) -> tuple[np.ndarray, int]:
    # ortho=True, extended=True reaches FastICA's (logcosh) solution and handles sub-Gaussian sources.
    _, unmixing, _, n_iter = picard(
        white.T,
        ortho=True,
        extended=True,
        whiten=False,
        max_iter=max_iter,
        tol=tol,
        random_state=random_state,
        return_n_iter=True,
    )
    return unmixing, int(n_iter)


@functools.lru_cache(maxsize=64)
def _null_max_negentropy(
    n_cells: int, n_components: int, n_reps: int, random_state: int, algorithm: str, max_iter: int, tol: float
) -> np.ndarray:
    """Largest component negentropy that the fit's own ICA finds in white Gaussian data, per replicate (cached).

    The same algorithm, iteration limit and tolerance as the fit, so that a Gaussian sample's statistic is
    exchangeable with the replicates (a looser null, 200 iterations at 1e-4, had a lighter upper tail).
    """
    rng = np.random.default_rng([random_state, n_cells, n_components])
    backend = _fastica_rotation if algorithm == "fastica" else _picard_rotation
    out = np.empty(n_reps)
    for rep in range(n_reps):
        g = rng.standard_normal((n_cells, n_components))
        g = _pca_whiten(g - g.mean(axis=0), n_components)[0]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            rotation, _ = backend(g, rep, max_iter, tol)
        out[rep] = negentropy(g @ linalg.polar(rotation)[0].T).max()
    out.flags.writeable = False  # shared by the cache
    return out


def _null_rank(n_reps: int, alpha: float) -> int:
    """Rank (1-based) of the null replicate used as threshold: Gaussian data exceed it with probability <= alpha.

    A new Gaussian sample's largest negentropy is exchangeable with the ``n_reps`` replicates, so it exceeds the
    ``r``-th smallest with probability ``(n_reps + 1 - r) / (n_reps + 1)``: ``r = ceil((n_reps + 1)(1 - alpha))``.
    The interpolated ``1 - alpha`` quantile of 20 replicates (19.05th) was exceeded about twice as often as alpha.
    """
    return math.ceil((n_reps + 1) * (1.0 - alpha) - 1e-9)


def _pca_whiten(centred: np.ndarray, n_components: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(white data, whitening k x d, dewhitening d x k, variances) from the sample covariance (``ddof=0``)."""
    cov = centred.T @ centred / centred.shape[0]
    variances, vectors = np.linalg.eigh(cov)
    order = np.argsort(variances)[::-1][:n_components]
    variances, vectors = variances[order], vectors[:, order]
    if variances[-1] <= 1e-10 * max(variances[0], 1e-300):
        raise InvalidDataError(
            f"The latents have {int(np.sum(variances <= 1e-10 * variances[0]))} direction(s) of (near) zero variance, "
            "which whitening cannot scale to unit variance; pass a smaller n_components."
        )
    whitening = vectors.T / np.sqrt(variances)[:, None]
    dewhitening = vectors * np.sqrt(variances)[None, :]
    return centred @ whitening.T, whitening, dewhitening, variances


class ICARotation(TransformerMixin, BaseEstimator):
    """Whitening followed by an ICA rotation, with a fixed sign and order convention.

    ``fit`` finds ``s = rotation_ @ whitening_ @ (z - mean_)``: PCA whitening (``whitening_ Sigma whitening_^T = I``),
    then the orthogonal ``rotation_`` from FastICA (scikit-learn, log-cosh contrast) or Picard
    (``ortho=True, extended=True``). The module docstring says what each step preserves.

    Conventions, so that repeated fits can be compared:

    * **order**: by decreasing non-Gaussianity (:func:`negentropy`);
    * **sign**: a component with significant skewness (``|skew| > 2 sqrt(6/n)``) is made positively skewed, a
      property of the source itself, so the same source gets the same sign in every fit; a symmetric component has no
      intrinsic sign, and its largest-magnitude entry of ``mixing_`` (its loading on the input latent coordinates) is
      made positive (statsmodels' rule).

    Parameters
    ----------
    n_components
        Components to keep (the leading principal directions); default: all.
    algorithm
        ``"fastica"`` or ``"picard"``.
    whiten
        PCA-whiten first (default). ``False`` only centres the latents, assumed already white, so that the whole map
        is orthogonal; it then requires ``n_components=None``.
    random_state
        Seed of the ICA's initial rotation.
    max_iter, tol
        ICA iteration limit and tolerance.
    n_null
        Replicates of the Gaussian null used to flag near-Gaussian components (0 disables the flags and the warning).
    null_alpha
        A component is flagged as Gaussian when its negentropy is at most an order statistic of the largest
        negentropies the fit's own ICA finds in ``n_null`` samples of white Gaussian data of the same dimension and
        size (the largest of 20 at the defaults; ``n_null >= 1 / null_alpha - 1`` is needed). Gaussian data exceed
        it with probability ``null_alpha`` on average over ``random_state``, which alone seeds the null: at a fixed
        ``random_state`` the probability is one draw around it (docs/concepts/ica.md gives the measured spread).

    Attributes
    ----------
    mean_
        Mean of the fitted latents, (d,).
    whitening_
        PCA whitening matrix, (k, d); the identity when ``whiten=False``.
    dewhitening_
        Its (pseudo-)inverse, (d, k).
    explained_variance_
        Latent variance along each kept principal direction, (k,).
    rotation_
        Orthogonal ICA rotation in the whitened space, (k, k).
    components_
        Unmixing matrix ``rotation_ @ whitening_``, (k, d): ``s = components_ @ (z - mean_)``.
    mixing_
        ``dewhitening_ @ rotation_.T``, (d, k): ``z ~ mean_ + mixing_ @ s`` (exact when ``k = d``). Column ``i`` is
        component ``i``'s direction in the input latent coordinates.
    kurtosis_, skewness_, negentropy_
        Excess kurtosis, skewness and log-cosh negentropy of each component on the fitted data.
    negentropy_threshold_
        Negentropy below which a component counts as Gaussian (NaN when ``n_null=0``).
    gaussian_
        Boolean flag per component: too close to Gaussian to be identified.
    gaussian_subspace_
        Orthonormal basis (d, m) of the span of the flagged components' ``mixing_`` columns in the input coordinates:
        identified as a subspace (compare it across fits by principal angles), not as axes.
    component_names_
        ``["IC_0", "IC_1", ...]`` in the order of the convention above.
    n_iter_, converged_
        ICA iterations used, and whether it converged before ``max_iter``.

    Warns
    -----
    NonIdentifiableComponentsWarning
        When two or more components are flagged as Gaussian (one Gaussian component is still identified, as the
        complement of the others).

    Examples
    --------
    >>> import numpy as np
    >>> from countvae.ica import ICARotation
    >>> rng = np.random.default_rng(0)
    >>> sources = rng.laplace(size=(2000, 3))
    >>> latents = sources @ rng.normal(size=(3, 3))
    >>> ica = ICARotation(random_state=0).fit(latents)
    >>> ica.transform(latents).shape
    (2000, 3)

    """

    def __init__(
        self,
        n_components: int | None = None,
        algorithm: Algorithm = "fastica",
        whiten: bool = True,
        random_state: int = 0,
        max_iter: int = 1000,
        tol: float = 1e-5,
        n_null: int = 20,
        null_alpha: float = 0.05,
    ):
        self.n_components = n_components
        self.algorithm = algorithm
        self.whiten = whiten
        self.random_state = random_state
        self.max_iter = max_iter
        self.tol = tol
        self.n_null = n_null
        self.null_alpha = null_alpha

    # ----- fitting ---------------------------------------------------------------------------
    def _check_params(self, n_dims: int) -> int:
        check_choice("algorithm", self.algorithm, ("fastica", "picard"))
        check_bool("whiten", self.whiten)
        check_int("random_state", self.random_state, 0)
        check_number("tol", self.tol, 0.0, low_open=True)
        k = n_dims if self.n_components is None else check_int("n_components", self.n_components, 1, n_dims)
        if not self.whiten and k != n_dims:
            raise InvalidArgumentError("whiten=False keeps every dimension; leave n_components=None.")
        check_int("max_iter", self.max_iter, 1)
        check_int("n_null", self.n_null, 0)
        check_number("null_alpha", self.null_alpha, 0.0, 1.0, low_open=True, high_open=True)
        if self.n_null and _null_rank(self.n_null, self.null_alpha) > self.n_null:
            raise InvalidArgumentError(
                f"n_null={self.n_null} Gaussian replicates cannot flag components at null_alpha={self.null_alpha}: "
                "even their largest negentropy is exceeded by chance in 1 of n_null + 1 Gaussian samples. Pass "
                f"n_null >= {math.ceil(1.0 / self.null_alpha - 1.0 - 1e-9)}, or a larger null_alpha."
            )
        return k

    def fit(self, latents: np.ndarray, y: Any = None) -> ICARotation:
        """Fit the whitening and the rotation to latent means of shape (cells, d).

        Parameters
        ----------
        latents
            Latent representation, e.g. ``model.get_latent_representation()``.
        y
            Ignored (scikit-learn convention).

        Returns
        -------
        ICARotation
            ``self``.

        """
        z = _check_latents(latents)
        n, d = z.shape
        k = self._check_params(d)
        self.mean_ = z.mean(axis=0)
        centred = z - self.mean_
        if self.whiten:
            white, self.whitening_, self.dewhitening_, self.explained_variance_ = _pca_whiten(centred, k)
        else:
            white = centred
            self.whitening_ = np.eye(d)
            self.dewhitening_ = np.eye(d)
            self.explained_variance_ = np.var(centred, axis=0)
        backend = _fastica_rotation if self.algorithm == "fastica" else _picard_rotation
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)  # reported below, with its likely cause
            rotation, self.n_iter_ = backend(white, int(self.random_state), int(self.max_iter), float(self.tol))
        self.converged_ = self.n_iter_ < int(self.max_iter)
        rotation = linalg.polar(rotation)[0]  # the nearest orthogonal matrix
        sources = white @ rotation.T
        order = np.argsort(-negentropy(sources), kind="stable")
        rotation, sources = rotation[order], sources[:, order]
        rotation = rotation * self._signs(sources, self.dewhitening_ @ rotation.T)[:, None]
        self.rotation_ = rotation
        self.components_ = rotation @ self.whitening_
        self.mixing_ = self.dewhitening_ @ rotation.T
        sources = white @ rotation.T
        self.kurtosis_ = excess_kurtosis(sources)
        self.skewness_ = skewness(sources)
        self.negentropy_ = negentropy(sources)
        self.component_names_ = [f"IC_{i}" for i in range(k)]
        self._flag_gaussian(n, k)
        return self

    @staticmethod
    def _signs(sources: np.ndarray, mixing: np.ndarray) -> np.ndarray:
        skew = skewness(sources)
        significant = np.abs(skew) > 2.0 * np.sqrt(6.0 / sources.shape[0])
        largest = mixing[np.argmax(np.abs(mixing), axis=0), np.arange(mixing.shape[1])]
        signs = np.where(significant, np.sign(skew), np.sign(largest))
        return np.where(signs == 0, 1.0, signs)

    def _flag_gaussian(self, n_cells: int, k: int) -> None:
        if self.n_null == 0:
            self.negentropy_threshold_ = float("nan")
            self.gaussian_ = np.zeros(k, dtype=bool)
        else:
            # The null is simulated with at most _NULL_MAX_CELLS cells and rescaled: the
            # maximal negentropy of Gaussian data shrinks as 1 / n (n * J is stable in n).
            n_sim = min(n_cells, _NULL_MAX_CELLS)
            null = _null_max_negentropy(
                n_sim, k, int(self.n_null), int(self.random_state), self.algorithm, int(self.max_iter), float(self.tol)
            )
            threshold = np.sort(null)[_null_rank(int(self.n_null), float(self.null_alpha)) - 1]
            self.negentropy_threshold_ = float(threshold * n_sim / n_cells)
            self.gaussian_ = self.negentropy_ <= self.negentropy_threshold_
        flagged = np.flatnonzero(self.gaussian_)
        self.gaussian_subspace_ = np.linalg.qr(self.mixing_[:, flagged])[0]  # (d, 0) when none is flagged
        if flagged.size >= 2:
            names = ", ".join(self.component_names_[i] for i in flagged)
            unconverged = "" if self.converged_ else " ICA did not converge, as expected inside a Gaussian subspace."
            warn_at_caller(
                f"ICA components {names} are too close to Gaussian to be identified (negentropy at most "
                f"{self.negentropy_threshold_:.2g}, what ICA finds in Gaussian noise of this size): their "
                f"{flagged.size}-dimensional span is determined by the data, the axes inside it are not. "
                f"Report them as one subspace (ICARotation.gaussian_subspace_), not as separate axes.{unconverged}",
                NonIdentifiableComponentsWarning,
            )
        elif not self.converged_:
            warn_at_caller(
                f"ICA ({self.algorithm}) did not converge in {self.max_iter} iterations; the rotation may not be "
                "reproducible. Raise max_iter or check the components' non-Gaussianity (summary()).",
                ConvergenceWarning,
            )

    # ----- mapping -----------------------------------------------------------------------------
    def _require_fitted(self) -> None:
        if not hasattr(self, "components_"):
            raise NotFittedError("This ICARotation is not fitted yet; call fit(latents) first.")

    def transform(self, latents: np.ndarray) -> np.ndarray:
        """Sources ``(z - mean_) @ components_.T``, shape (cells, k)."""
        self._require_fitted()
        z = _finite_matrix(latents, "latents", self.mean_.shape[0])
        return (z - self.mean_) @ self.components_.T

    def inverse_transform(self, sources: np.ndarray) -> np.ndarray:
        """Latents ``mean_ + sources @ mixing_.T`` (the projection on the kept components when ``k < d``)."""
        self._require_fitted()
        s = _finite_matrix(sources, "sources", self.mixing_.shape[1])
        return self.mean_ + s @ self.mixing_.T

    def summary(self) -> pd.DataFrame:
        """One row per component: excess kurtosis, skewness, negentropy and the Gaussian flag."""
        self._require_fitted()
        return pd.DataFrame(
            {
                "excess_kurtosis": self.kurtosis_,
                "skewness": self.skewness_,
                "negentropy": self.negentropy_,
                "gaussian": self.gaussian_,
            },
            index=pd.Index(self.component_names_, name="component"),
        )


# ----- stability across seeds or bootstrap resamples ----------------------------------------------


@dataclass
class ICAStability:
    """How well each ICA component reproduces across seeds or bootstrap resamples.

    Attributes
    ----------
    table
        One row per component of the reference fit: ``mean``, ``median`` and ``min`` best-match |correlation| over the
        other runs, the reference's ``negentropy`` and ``gaussian`` flag, and ``reproducible`` (``mean >= threshold``).
    matches
        Best-match |correlation| of each reference component (columns) in each other run (rows).
    mode
        ``"seeds"`` (one latent matrix per fit) or ``"bootstrap"``.
    resample
        Which cells each ICA was estimated on, see :func:`ica_stability`.
    threshold
        The reproducibility threshold used.
    reference
        The reference :class:`ICARotation` (fitted on the reference cells).

    """

    table: pd.DataFrame
    matches: pd.DataFrame
    mode: str
    resample: str
    threshold: float
    reference: ICARotation

    @property
    def mcc(self) -> pd.Series:
        """Mean matched |correlation| per run (the cross-run MCC)."""
        return self.matches.mean(axis=1)

    @property
    def unstable(self) -> list[str]:
        """Names of the components that do not reproduce."""
        return list(self.table.index[~self.table["reproducible"]])


def _fit_quiet(latents: np.ndarray, params: dict[str, Any], flags: bool = False) -> ICARotation:
    """An ICA fit without warnings; without ``flags`` (a fit used only for matching) no Gaussian flags either."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonIdentifiableComponentsWarning)
        warnings.simplefilter("ignore", ConvergenceWarning)
        return ICARotation(**(params if flags else dict(params, n_null=0))).fit(latents)


def _runs(latents: np.ndarray | Sequence[np.ndarray]) -> list[np.ndarray]:
    """One (cells, d) array, or several of the same shape, as a list of checked float64 arrays."""
    if hasattr(latents, "shape") and len(latents.shape) != 3:  # one array or data frame (3-d: stacked fits)
        return [_check_latents(latents)]
    runs = [_check_latents(z, f"latents[{i}]") for i, z in enumerate(latents)]
    if not runs:
        raise InvalidDataError("latents is an empty sequence; pass one (cells, d) array or several.")
    shapes = sorted({z.shape for z in runs})
    if len(shapes) != 1:
        raise InvalidDataError(
            f"The latent matrices must describe the same cells in the same number of dimensions; got shapes {shapes}."
        )
    return runs


@dataclass
class SplitHalfICAs:
    """Each fit's ICA estimated on one of two disjoint halves of the same cells.

    The scheme behind :func:`ica_stability` (seeds mode) and the report's per-component table
    (:func:`countvae.diagnostics.analyses.components.ica_component_stability`): no cell informs both sides of a
    comparison, so a shared sample accident cannot fake agreement.

    Attributes
    ----------
    reference
        The first fit's ICA on ``halves[0]``, with its Gaussian flags.
    others
        Each later fit's ICA on ``halves[1]``.
    own
        The first fit's own ICA on ``halves[1]``: what one fit's ICA reproduces
        from one half to the other (the baseline of :func:`attenuation_ratio`).
    halves
        The two halves, as sorted row positions.

    """

    reference: ICARotation
    others: list[ICARotation]
    own: ICARotation
    halves: tuple[np.ndarray, np.ndarray]


def split_half_icas(latents: Sequence[np.ndarray], random_state: int = 0, **ica_params: Any) -> SplitHalfICAs:
    """Estimate each fit's ICA on one of two random disjoint halves of the cells.

    Parameters
    ----------
    latents
        Two or more (cells, d) arrays of the same cells, one per fit; the first is the reference.
    random_state
        Seed of the split and of the ICA initialisations (``random_state + i`` for fit ``i``,
        ``random_state + len(latents)`` for the first fit's own ICA on the second half), so every ICA starts from its
        own point.
    **ica_params
        Passed to :class:`ICARotation`.

    Returns
    -------
    SplitHalfICAs

    """
    random_state = check_int("random_state", random_state, 0)
    runs = _runs(latents)
    if len(runs) < 2:
        raise InvalidArgumentError(f"Split-half ICAs need at least two fits, got {len(runs)}.")
    n = runs[0].shape[0]
    order = np.random.default_rng(random_state).permutation(n)
    half_a, half_b = np.sort(order[: n // 2]), np.sort(order[n // 2 :])
    reference = _fit_quiet(runs[0][half_a], dict(ica_params, random_state=random_state), flags=True)
    others = [
        _fit_quiet(z[half_b], dict(ica_params, random_state=random_state + i)) for i, z in enumerate(runs[1:], start=1)
    ]
    own = _fit_quiet(runs[0][half_b], dict(ica_params, random_state=random_state + len(runs)))
    return SplitHalfICAs(reference, others, own, (half_a, half_b))


def attenuation_ratio(match: np.ndarray | float, same_fit: np.ndarray | float) -> np.ndarray | float:
    """A cross-fit match divided by the same fit's split-half match (NaN where the latter is 0).

    An ICA estimated on a finite half is off its population axis, an error that lowers every match it enters, the same
    fit's across halves as much as another fit's. The ratio (Spearman's correction for attenuation) is the cross-fit
    match that ICAs estimated on the whole distribution would have; above 1 it is estimation noise (callers cap it).
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.asarray(same_fit) > 0, np.asarray(match) / np.asarray(same_fit), np.nan)[()]


def ica_stability(
    latents: np.ndarray | Sequence[np.ndarray],
    *,
    resample: Literal["halves", "bootstrap", "none"] = "halves",
    n_bootstrap: int = 20,
    threshold: float = 0.95,
    method: Literal["pearson", "spearman"] = "pearson",
    random_state: int = 0,
    **ica_params: Any,
) -> ICAStability:
    """Measure whether ICA components reproduce across fits (seeds) or resamples of the cells.

    Each component of a reference ICA fit is matched (Hungarian, on |correlation| over all cells) to the components of
    every other fit; its best-match |correlation| is reported per fit and on average.

    *Seeds mode* (several latent matrices of the same cells, one per model fit): the reference is the first fit's
    ICA, the others the later fits'. *Bootstrap mode* (one latent matrix): the others are ICAs of ``n_bootstrap``
    resamples of the cells (Icasso-style, Himberg et al. 2004).

    ``resample`` picks the cells each ICA is estimated on (each is then applied to all cells):

    * ``"halves"`` (default): the reference on a random half of the cells, the others on the other half (seeds,
      :func:`split_half_icas`) or on bootstrap resamples of it (bootstrap mode). No cell informs both sides of a
      comparison.
    * ``"bootstrap"``: the reference on all cells, the others on bootstrap resamples of them.
    * ``"none"`` (seeds mode only): every ICA on all cells.

    Why: a finite Gaussian sample has accidental most-non-Gaussian directions, and fits that agree up to a linear map on
    the same cells (as VAE seeds nearly do) hand affine-equivariant ICA the same accident: noisy rotated copies of one
    3-d Gaussian sample give matches of 0.98 with ``"none"`` and can still give 0.95 with ``"bootstrap"`` (a resample
    keeps most of the sample), but 0.72 to 0.91 with ``"halves"``, around the chance level of a random rotation
    (``2 sqrt(2) / pi = 0.90`` for a plane, 0.83 for three, 0.77 for four, 0.69 for six dimensions); Laplace sources
    give 0.99 in every scheme, hence the default ``threshold`` of 0.95.

    Seeds with ``"halves"`` follow the report's ICA rule on point estimates: ``reproducible`` when not flagged Gaussian,
    matched at ``threshold`` by the first fit's own ICA on the other half (``same_fit``), and with ``corrected`` (worst
    match / ``same_fit``, :func:`attenuation_ratio`, capped at 1) at least ``threshold``. Elsewhere those columns are
    NaN, the rule ``mean >= threshold``.

    Parameters
    ----------
    latents
        One (cells, d) array (bootstrap mode), or several arrays of the same
        cells (seeds mode), e.g. ``[m.get_latent_representation(adata) for m in models]``.
    resample
        ``"halves"``, ``"bootstrap"`` or ``"none"``, see above.
    n_bootstrap
        Resamples in bootstrap mode.
    threshold
        The reproducibility threshold, see above.
    method
        ``"pearson"`` or ``"spearman"`` correlation.
    random_state
        Seed of the resampling and of the ICA initialisations (``random_state + i`` for fit ``i``).
    **ica_params
        Passed to :class:`ICARotation` (e.g. ``algorithm``, ``n_components``).

    Returns
    -------
    ICAStability

    """
    runs = _checked_stability_inputs(latents, resample, n_bootstrap, threshold, method)
    mode = "bootstrap" if len(runs) == 1 else "seeds"
    if mode == "bootstrap":
        (reference, others), own = _bootstrap_icas(runs[0], resample, n_bootstrap, random_state, ica_params), None
    elif resample == "halves":
        split = split_half_icas(runs, random_state, **ica_params)
        reference, others, own = split.reference, split.others, split.own
    else:
        (reference, others), own = _seed_icas(runs, resample, random_state, ica_params), None
    labels = [f"bootstrap {b}" if mode == "bootstrap" else f"run {b + 1}" for b in range(len(others))]
    ref_sources = reference.transform(runs[0])
    matched = runs[1:] if mode == "seeds" else [runs[0]] * len(others)  # the latents each other ICA transforms
    rows = [_best_match(ref_sources, ica.transform(z), method) for ica, z in zip(others, matched, strict=True)]
    matches = pd.DataFrame(np.vstack(rows), index=labels, columns=reference.component_names_)
    table = _stability_table(reference, matches, own, runs[0], ref_sources, method, threshold)
    if not table["reproducible"].all():
        logger.info("ICA components that do not reproduce (%s): %s", mode, list(table.index[~table["reproducible"]]))
    return ICAStability(
        table=table, matches=matches, mode=mode, resample=resample, threshold=float(threshold), reference=reference
    )


def _checked_stability_inputs(
    latents: np.ndarray | Sequence[np.ndarray], resample: str, n_bootstrap: int, threshold: float, method: str
) -> list[np.ndarray]:
    """The latent matrices of :func:`ica_stability`, with its settings checked before any ICA is fitted."""
    check_number("threshold", threshold, 0.0, 1.0, low_open=True)
    check_choice("resample", resample, ("halves", "bootstrap", "none"))
    check_choice("method", method, ("pearson", "spearman"))
    runs = _runs(latents)
    n, d = runs[0].shape
    if resample == "halves" and n // 2 < d + 2:
        raise InvalidDataError(
            f"resample='halves' estimates each ICA on half of the {n} cells, too few for {d} dimensions "
            f"(at least {2 * (d + 2)} cells); pass more cells or resample='bootstrap'."
        )
    if len(runs) == 1 and resample == "none":
        raise InvalidArgumentError("resample='none' needs several fits; one latent matrix needs resampling.")
    if len(runs) == 1:
        check_int("n_bootstrap", n_bootstrap, 1)
    return runs


def _bootstrap_icas(
    z: np.ndarray, resample: str, n_bootstrap: int, random_state: int, ica_params: dict[str, Any]
) -> tuple[ICARotation, list[ICARotation]]:
    """One fit: the reference ICA (on one half, or all cells) and ICAs of bootstrap resamples of the rest."""
    rng = np.random.default_rng(random_state)
    n = z.shape[0]
    if resample == "halves":
        order = rng.permutation(n)
        ref_cells, other_cells = np.sort(order[: n // 2]), np.sort(order[n // 2 :])
    else:
        ref_cells = other_cells = np.arange(n)
    reference = _fit_quiet(z[ref_cells], dict(ica_params, random_state=random_state), flags=True)
    others = []
    for b in range(n_bootstrap):
        sample = z[other_cells[rng.integers(0, other_cells.size, other_cells.size)]]
        others.append(_fit_quiet(sample, dict(ica_params, random_state=random_state + b + 1)))
    return reference, others


def _seed_icas(
    runs: list[np.ndarray], resample: str, random_state: int, ica_params: dict[str, Any]
) -> tuple[ICARotation, list[ICARotation]]:
    """Several fits, ICAs on all cells (``"none"``) or the others' on bootstrap resamples (``"bootstrap"``)."""
    rng = np.random.default_rng(random_state)
    n = runs[0].shape[0]
    reference = _fit_quiet(runs[0], dict(ica_params, random_state=random_state), flags=True)
    others = []
    for i, z in enumerate(runs[1:], start=1):
        sample = z[rng.integers(0, n, n)] if resample == "bootstrap" else z
        others.append(_fit_quiet(sample, dict(ica_params, random_state=random_state + i)))
    return reference, others


def _stability_table(
    reference: ICARotation,
    matches: pd.DataFrame,
    own: ICARotation | None,
    z: np.ndarray,
    ref_sources: np.ndarray,
    method: str,
    threshold: float,
) -> pd.DataFrame:
    """Per component: the match summaries, the split-half baseline where there is one, and ``reproducible``."""
    table = pd.DataFrame(
        {
            "mean": matches.mean(axis=0),
            "median": matches.median(axis=0),
            "min": matches.min(axis=0),
            "negentropy": reference.negentropy_,
            "gaussian": reference.gaussian_.astype(bool),
        },
        index=pd.Index(reference.component_names_, name="component"),
    )
    if own is None:
        table["same_fit"] = table["corrected"] = np.nan
        table["reproducible"] = table["mean"] >= threshold
        return table
    same_fit = _best_match(ref_sources, own.transform(z), method)
    table["same_fit"] = same_fit
    table["corrected"] = np.minimum(attenuation_ratio(table["min"].to_numpy(), same_fit), 1.0)
    table["reproducible"] = (~table["gaussian"]) & (table["same_fit"] >= threshold) & (table["corrected"] >= threshold)
    return table


def _best_match(reference: np.ndarray, other: np.ndarray, method: str) -> np.ndarray:
    match = match_components(reference, other, method=method)
    out = np.zeros(reference.shape[1])
    out[match.rows] = np.abs(match.correlations)
    return out
