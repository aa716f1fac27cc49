"""Report sizes for tests, and stand-in fits for tests of plumbing (rendering, escaping, bad input).

``RotatedFit`` passes a trained fit's outputs through in rotated latent
coordinates (``z' = z Q^T``). It is a stand-in: it computes nothing of its own,
so it is **not** evidence for a verdict (verdict tests use real seeds, or exact
copies made with :func:`countvae.invariance.reparameterize`, whose every output
is computed by the copied model; see the ``seed_fits`` fixtures in conftest.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import ortho_group

from countvae.diagnostics import CountVAEFit

#: Report sizes small enough for tests.
SMALL = dict(
    n_lpd_samples=100, max_lpd_cells=100, n_rhat_draws=40, n_rhat_cells=8, max_jacobian_cells=60, n_bootstrap=100
)


def random_rotation(dim: int, seed: int) -> np.ndarray:
    """A Haar-random orthogonal matrix (reflections included)."""
    if dim == 1:
        return np.array([[-1.0]])
    return ortho_group.rvs(dim, random_state=seed)


@dataclass
class RotatedFit:
    """``base`` in the latent coordinates ``z' = z @ q.T``."""

    base: CountVAEFit
    q: np.ndarray
    seed: int
    name: str = ""
    kind: str = "countvae"

    def __post_init__(self):
        self.name = self.name or f"seed {self.seed}"

    @property
    def symmetry(self) -> str:
        return self.base.symmetry

    @property
    def var_names(self) -> pd.Index:
        return self.base.var_names

    @property
    def n_latent(self) -> int:
        return self.base.n_latent

    def latent(self, adata):
        return self.base.latent(adata) @ self.q.T

    def latent_samples(self, adata, n_samples, seed):
        return self.base.latent_samples(adata, n_samples, seed) @ self.q.T

    def log_predictive_density(self, adata, n_samples, seed):
        return self.base.log_predictive_density(adata, n_samples, seed)

    def normalized_expression(self, adata, library_size=1e4):
        return self.base.normalized_expression(adata, library_size)

    def decode_log_rate(self, adata, z):
        return self.base.decode_log_rate(adata, (np.asarray(z, dtype=np.float64) @ self.q).astype(np.float32))

    def loadings(self):
        w = self.base.loadings()
        return None if w is None else w @ self.q.T

    def decoder_jacobian(self, adata):
        return self.base.decoder_jacobian(adata) @ self.q.T

    def posterior_predictive(self, adata, n_samples, seed):
        return self.base.posterior_predictive(adata, n_samples, seed)


def rotated_copies(base: CountVAEFit, seeds: list[int]) -> list[RotatedFit]:
    """One rotated copy of ``base`` per seed (seed 0 keeps the base coordinates)."""
    return [RotatedFit(base, np.eye(base.n_latent) if s == 0 else random_rotation(base.n_latent, s), s) for s in seeds]


def assert_valid_report_json(record: dict) -> None:
    """``record`` (a parsed report.json) validates against the JSON Schema shipped with the package."""
    from jsonschema import Draft202012Validator

    from countvae.diagnostics.reporting.report_format import report_schema

    Draft202012Validator(report_schema()).validate(record)


def saved_and_loaded(rep, folder, table: str, column: str, bad_value, message: str):
    """Save ``rep``, check its report.json against the schema, that a bad ``bad_value`` in the first row's
    ``column`` of ``table`` fails it with ``message``, and return the report loaded back from the folder."""
    import copy
    import json

    import pytest
    from jsonschema import ValidationError

    from countvae.diagnostics import load_report

    saved = rep.save(folder)
    record = json.loads((saved / "report.json").read_text())
    assert_valid_report_json(record)
    corrupted = copy.deepcopy(record)
    corrupted["tables"][table][0][column] = bad_value
    with pytest.raises(ValidationError, match=message):
        assert_valid_report_json(corrupted)
    return load_report(saved)


def collect_for(seed_fits, needs: frozenset[str], settings):
    """What ``collect`` gives sections with ``needs`` from the fixture's fits, held-out and fit cells."""
    from countvae.diagnostics.reporting.collect import collect
    from countvae.diagnostics.reporting.stopwatch import Stopwatch

    return collect(
        list(seed_fits.fits),
        seed_fits.adata_heldout,
        None,
        settings,
        {},
        Stopwatch(),
        adata_fit=seed_fits.adata_fit,
        needs=needs,
    )
