"""Maps between two fits' latent spaces, and :class:`PairMaps`, which fits each of them once and shares it.

For two fits ``a`` and ``b`` evaluated on the same cells, a map ``T`` takes ``a``'s latent means to ``b``'s. The
classes, from most to least restrictive (:data:`MAP_CLASSES`):

``identity``
    ``T(z) = z``: the coordinates agree as they are.
``permutation``
    A signed permutation of the centred coordinates (Hungarian matching on the absolute correlations, each sign
    from its correlation; :func:`fit_signed_permutation`).
``orthogonal``
    A rigid rotation/reflection of the centred coordinates (:func:`scipy.linalg.orthogonal_procrustes`): the
    symmetry group of a N(0, I) prior.
``linear``
    A general affine map (least squares with intercept).
``ica``
    Each fit is rotated separately into ICA axes (:class:`countvae.ica.ICARotation`, :func:`fit_ica_axes`); the
    axes are matched by a signed permutation and a scale per axis. The rotation comes from each fit's own latents;
    the pairing of cells only picks the order, signs and scales.

The alignment scores, the invariants table and the cross-seed R-hat all use these maps. A report makes one
:class:`PairMaps` per set of cells the maps are fitted on (the alignment's fitting half; all held-out cells), so each
map is fitted once per pair of fits and each ICA once per fit.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy.linalg import orthogonal_procrustes
from scipy.optimize import linear_sum_assignment

from countvae.errors import InvalidArgumentError
from countvae.ica import ICARotation

MAP_CLASSES: tuple[str, ...] = ("identity", "permutation", "orthogonal", "linear", "ica")
#: Map classes whose map from ``b`` to ``a`` is exactly the inverse of the fitted map from ``a`` to ``b``
#: (their least-squares problems are symmetric), so :class:`PairMaps` fits them once per unordered pair.
SYMMETRIC_CLASSES = ("identity", "permutation", "orthogonal")
#: Cells ICA is fitted on at most (the rotation is then applied to every cell).
MAX_ICA_CELLS = 10_000


@dataclass(frozen=True)
class AffineMap:
    """``T(z) = z @ matrix + offset`` for row vectors ``z`` (any leading dimensions)."""

    matrix: np.ndarray
    offset: np.ndarray

    def __call__(self, z: np.ndarray) -> np.ndarray:
        """Apply the map to the rows of ``z``."""
        return z @ self.matrix + self.offset

    def orthogonal_inverse(self) -> AffineMap:
        """The inverse map, for a map whose ``matrix`` is orthogonal (its inverse is its transpose)."""
        inverse = self.matrix.T
        return AffineMap(inverse, -self.offset @ inverse)


@dataclass(frozen=True)
class ICAAxes:
    """A fit's latents in ICA axes: ``s = (z - mean) @ unmixing``, ``z = s @ mixing + mean``."""

    mean: np.ndarray
    unmixing: np.ndarray
    mixing: np.ndarray

    def transform(self, z: np.ndarray) -> np.ndarray:
        """Sources of ``z``."""
        return (z - self.mean) @ self.unmixing


def fit_ica_axes(z: np.ndarray, random_state: int = 0, max_iter: int = 1000, max_cells: int = MAX_ICA_CELLS) -> ICAAxes:
    """Whiten ``z`` and rotate it to maximally non-Gaussian axes with :class:`countvae.ica.ICARotation`.

    Only the rotation matters here (components are matched across fits afterwards), so the Gaussian null behind
    ``ICARotation``'s flags is skipped (``n_null=0``); :func:`countvae.ica.ica_stability` reports those flags.

    Parameters
    ----------
    z
        Latent means, (cells, d).
    random_state
        Seed of the ICA's initial rotation (and of the cell subset).
    max_iter
        ICA iterations.
    max_cells
        Fit on a random subset of at most this many cells.

    """
    if len(z) > max_cells:
        z = z[np.sort(np.random.default_rng(random_state).choice(len(z), max_cells, replace=False))]
    with warnings.catch_warnings():
        # A non-converged ICA still returns a valid rotation; the cross-fit error (and the ICA efficiency) shows how
        # useful it is.
        warnings.simplefilter("ignore")
        ica = ICARotation(random_state=random_state, max_iter=max_iter, n_null=0).fit(z)
    return ICAAxes(mean=ica.mean_.copy(), unmixing=ica.components_.T.copy(), mixing=ica.mixing_.T.copy())


def fit_signed_permutation(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Fit the signed permutation ``P`` that best matches the columns of ``a`` to those of ``b``.

    Columns are matched by the Hungarian algorithm on the absolute Pearson correlations (scale-free, unlike the raw
    cross-product ``a^T b``); each matched pair gets the sign of its correlation. ``a @ P`` has ``b``'s column order
    and signs. (:func:`countvae.invariance.signed_permutation` does the opposite: it builds such a matrix from a
    given order and signs.)
    """
    corr = _cross_correlation(a, b)
    rows, cols = linear_sum_assignment(-np.abs(corr))
    p = np.zeros_like(corr)
    p[rows, cols] = np.where(corr[rows, cols] < 0, -1.0, 1.0)
    return p


def _cross_correlation(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ac, bc = a - a.mean(0), b - b.mean(0)
    sa, sb = np.linalg.norm(ac, axis=0), np.linalg.norm(bc, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = (ac.T @ bc) / np.outer(sa, sb)
    return np.nan_to_num(corr)


def fit_map(
    kind: str, za: np.ndarray, zb: np.ndarray, ica_a: ICAAxes | None = None, ica_b: ICAAxes | None = None
) -> AffineMap:
    """Fit a map of class ``kind`` taking ``za`` to ``zb`` (rows are the same cells).

    Parameters
    ----------
    kind
        One of :data:`MAP_CLASSES`.
    za, zb
        Latent means of the two fits on the fitting cells, (cells, d).
    ica_a, ica_b
        ICA axes of each fit (required for ``kind="ica"``; see :func:`fit_ica_axes`).

    """
    ma, mb = za.mean(0), zb.mean(0)
    d_a, d_b = za.shape[1], zb.shape[1]
    if kind == "linear":
        design = np.column_stack([za, np.ones(len(za))])
        coef, *_ = np.linalg.lstsq(design, zb, rcond=None)
        return AffineMap(coef[:-1], coef[-1])
    if d_a != d_b:
        raise InvalidArgumentError(f"A {kind!r} map needs latents of equal width, got {d_a} and {d_b}.")
    if kind == "identity":
        return AffineMap(np.eye(d_a), np.zeros(d_a))
    if kind == "permutation":
        p = fit_signed_permutation(za, zb)
        return AffineMap(p, mb - ma @ p)
    if kind == "orthogonal":
        r, _ = orthogonal_procrustes(za - ma, zb - mb)
        return AffineMap(r, mb - ma @ r)
    if kind == "ica":
        if ica_a is None or ica_b is None:
            raise InvalidArgumentError("An 'ica' map needs the ICA axes of both fits.")
        sa, sb = ica_a.transform(za), ica_b.transform(zb)
        p = fit_signed_permutation(sa, sb)
        matched = sa @ p
        scale = np.std(sb, axis=0) / np.maximum(np.std(matched, axis=0), 1e-12)
        matrix = ica_a.unmixing @ p @ np.diag(scale) @ ica_b.mixing
        return AffineMap(matrix, ica_b.mean - ica_a.mean @ matrix)
    raise InvalidArgumentError(f"Unknown map class {kind!r}; choose from {MAP_CLASSES}.")


class PairMaps:
    """The maps between every pair of fits on one set of cells, each fitted once, on first use, and shared.

    A map of a symmetric class (:data:`SYMMETRIC_CLASSES`: identity, signed permutation, orthogonal) is fitted once
    per unordered pair, from the earlier fit (in the order of ``latents``) to the later one; the map back is its
    inverse. Linear and ICA maps are fitted once per ordered pair (a least-squares map back is not the inverse).
    Each fit's ICA axes are fitted once and shared by every ICA map.

    Parameters
    ----------
    latents
        Fit name -> latent means on the same cells, (cells, d) each.
    seed
        Seed of the ICAs (``random_state`` of :func:`fit_ica_axes`).

    Attributes
    ----------
    fit_counts
        How many maps of each class, and how many ICAs (``"ica axes"``), were fitted.

    """

    def __init__(self, latents: Mapping[str, np.ndarray], seed: int = 0):
        self.latents = {name: np.asarray(z, dtype=np.float64) for name, z in latents.items()}
        self.names = list(self.latents)
        self.seed = seed
        self.fit_counts: Counter[str] = Counter()
        self._maps: dict[tuple[str, str, str], AffineMap] = {}
        self._axes: dict[str, ICAAxes] = {}

    def ica_axes(self, name: str) -> ICAAxes:
        """The ICA axes of fit ``name`` (fitted on first use)."""
        if name not in self._axes:
            self._axes[name] = fit_ica_axes(self.latents[name], random_state=self.seed)
            self.fit_counts["ica axes"] += 1
        return self._axes[name]

    def map(self, kind: str, a: str, b: str) -> AffineMap:
        """The map of class ``kind`` taking fit ``a``'s latents to fit ``b``'s."""
        if kind not in MAP_CLASSES:
            raise InvalidArgumentError(f"Unknown map class {kind!r}; choose from {MAP_CLASSES}.")
        key = (kind, a, b)
        if key not in self._maps:
            if kind in SYMMETRIC_CLASSES and self.names.index(a) > self.names.index(b):
                # Fitted in the order of the fits, whichever direction is asked first, so the numbers do not
                # depend on the order in which analyses ask.
                self._maps[key] = self.map(kind, b, a).orthogonal_inverse()
            else:
                axes = (self.ica_axes(a), self.ica_axes(b)) if kind == "ica" else (None, None)
                self._maps[key] = fit_map(kind, self.latents[a], self.latents[b], *axes)
                self.fit_counts[kind] += 1
        return self._maps[key]

    def orthogonal(self, a: str, b: str) -> AffineMap:
        """The orthogonal Procrustes map taking fit ``a``'s latents to fit ``b``'s."""
        return self.map("orthogonal", a, b)

    def to_reference(self, reference: str) -> dict[str, AffineMap]:
        """Orthogonal maps taking each fit's latents to ``reference``'s (the identity for ``reference`` itself)."""
        dim = self.latents[reference].shape[1]
        identity = AffineMap(np.eye(dim), np.zeros(dim))
        return {name: identity if name == reference else self.orthogonal(name, reference) for name in self.names}
