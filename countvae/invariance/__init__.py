"""Orthogonal reparameterizations of a fitted model, and the numerical verification that p(x) is unchanged by them.

>>> from countvae import invariance
>>> Q = invariance.random_orthogonal(model.n_latent, seed=0)  # doctest: +SKIP
>>> rotated = invariance.reparameterize(model, Q)  # an equivalent fitted CountVAE, z' = Qz  # doctest: +SKIP
>>> report = invariance.verify(model, adata_heldout)  # doctest: +SKIP
>>> report.passed, report.to_frame()  # doctest: +SKIP
>>> report.save("invariance_report")  # report.json, report.md, report.html  # doctest: +SKIP

``verify`` (verification.py) puts together the maps and prior controls (controls.py), the models evaluated on the
cells (evaluation.py) and the checks (checks.py, one function each, with what each can and cannot catch) into an
``InvarianceReport`` (result.py). Exact ``log p(x)`` of linear models: quadrature.py (eigenvector-oriented, a fast
reference for the estimators) and grid_quadrature.py (axis-aligned, the invariance checks' reference).
"""

from countvae.invariance.controls import control_transforms, default_transforms, prior_preserves, with_prior
from countvae.invariance.evaluation import VerifySettings
from countvae.invariance.grid_quadrature import GridQuadrature, grid_log_marginal, grid_quadrature
from countvae.invariance.quadrature import log_marginal_linear, quadrature_log_marginal
from countvae.invariance.reparameterize import check_trained_model, reparameterize, reparameterize_ica
from countvae.invariance.result import InvarianceReport
from countvae.invariance.transforms import (
    axis_scaling,
    check_orthogonal,
    classify,
    default_scaling,
    is_signed_permutation,
    nearest_orthogonal,
    permutation,
    random_orthogonal,
    random_permutation,
    random_reflection,
    random_rotation,
    random_signed_permutation,
    reflection,
    shear,
    signed_permutation,
)
from countvae.invariance.verification import verify
from countvae.model import copy_model

__all__ = [
    "GridQuadrature",
    "InvarianceReport",
    "VerifySettings",
    "axis_scaling",
    "check_orthogonal",
    "check_trained_model",
    "classify",
    "control_transforms",
    "copy_model",
    "default_scaling",
    "default_transforms",
    "grid_log_marginal",
    "grid_quadrature",
    "is_signed_permutation",
    "log_marginal_linear",
    "nearest_orthogonal",
    "permutation",
    "prior_preserves",
    "quadrature_log_marginal",
    "random_orthogonal",
    "random_permutation",
    "random_reflection",
    "random_rotation",
    "random_signed_permutation",
    "reflection",
    "reparameterize",
    "reparameterize_ica",
    "shear",
    "signed_permutation",
    "verify",
    "with_prior",
]
