"""Every call into arviz lives here, so that a move to arviz 1.x touches one file.

arviz 0.23 gives the model-comparison table (``az.compare``) from held-out pointwise log predictive densities, the
convergence diagnostics R-hat and ESS (``az.rhat``, ``az.ess``), and the Pareto k-hat of importance weights
(``az.psislw``) that says when an importance-sampling estimate and its standard error cannot be trusted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Iterator, Mapping

import numpy as np
import pandas as pd


def _forget_partial_import(package: str) -> None:
    """Drop ``package`` and its submodules from ``sys.modules`` after its import failed half-way, to import it again."""
    for name in [m for m in sys.modules if m == package or m.startswith(f"{package}.")]:
        del sys.modules[name]


@contextlib.contextmanager
def _temporary_cache_folder() -> Iterator[None]:
    """Point ``XDG_CACHE_HOME`` at a new temporary folder within the block; restore it and remove the folder after."""
    previous = os.environ.get("XDG_CACHE_HOME")
    folder = tempfile.mkdtemp(prefix="countvae-arviz-cache.")
    os.environ["XDG_CACHE_HOME"] = folder
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = previous
        shutil.rmtree(folder, ignore_errors=True)


# arviz 0.23 logs at INFO which of its 1.x preview packages are missing; that is noise for our users.
logging.getLogger("arviz.preview").setLevel(logging.WARNING)
with warnings.catch_warnings():
    # arviz 0.23 announces its 1.x refactor with a FutureWarning at import.
    warnings.simplefilter("ignore", FutureWarning)
    try:
        import arviz as az
    except OSError:
        # arviz 0.23 stamps the day of that warning in the user's cache folder at import: an unwritable or missing
        # HOME or XDG_CACHE_HOME (a service account, a read-only container) fails it. Nothing else reads the stamp.
        _forget_partial_import("arviz")
        with _temporary_cache_folder():
            import arviz as az
    import xarray as xr


def _elpd_data(pointwise: np.ndarray) -> az.ELPDData:
    """Held-out pointwise ``log p(x_i)`` as arviz ELPD data.

    arviz keys its comparison on the label ``elpd_loo``; the values here are test-set log predictive densities of
    held-out cells, not PSIS-LOO estimates, hence ``p_loo`` 0 and no Pareto-k warning.
    """
    values = np.asarray(pointwise, dtype=np.float64)
    n = values.size
    return az.ELPDData(
        data=[
            values.sum(),
            float(np.sqrt(n * values.var())),
            0.0,
            1,
            n,
            False,
            xr.DataArray(values, dims=["cell"]),
            "log",
        ],
        index=["elpd_loo", "se", "p_loo", "n_samples", "n_data_points", "warning", "loo_i", "scale"],
    )


def compare_pointwise(pointwise: Mapping[str, np.ndarray]) -> pd.DataFrame:
    """An ``az.compare`` table from held-out pointwise log predictive densities.

    Stacking weights are computed from the values minus their per-cell maximum over models: with per-cell log
    densities in the hundreds of nats the weights otherwise underflow to uniform (shared/notes/scvi_pyro_anchors.md,
    section 5). The shift, common to all models, leaves ``elpd_diff`` and ``dse`` unchanged; the ``elpd`` and ``se``
    columns are restored from the unshifted values.

    Parameters
    ----------
    pointwise
        Model name -> per-cell ``log p(x)`` on the same held-out cells (nats).

    Returns
    -------
    pandas.DataFrame
        Indexed by model, best first, with ``rank``, ``elpd`` (sum over cells), ``elpd_diff`` (to the best), ``dse``
        (paired standard error of the difference), ``se``, ``weight`` (stacking).

    """
    names = list(pointwise)
    matrix = np.stack([np.asarray(pointwise[k], dtype=np.float64) for k in names])
    shifted = matrix - matrix.max(axis=0, keepdims=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        table = az.compare({k: _elpd_data(row) for k, row in zip(names, shifted, strict=True)}, ic="loo")
    raw = {k: _elpd_data(row) for k, row in zip(names, matrix, strict=True)}
    return pd.DataFrame(
        {
            "rank": table["rank"].astype(int),
            "elpd": [float(raw[k]["elpd_loo"]) for k in table.index],
            "elpd_diff": table["elpd_diff"].astype(float),
            "dse": table["dse"].astype(float),
            "se": [float(raw[k]["se"]) for k in table.index],
            "weight": table["weight"].astype(float),
        },
        index=pd.Index(table.index, name="fit"),
    )


def pareto_khat(log_weights: np.ndarray) -> np.ndarray:
    """Pareto k-hat of the importance weights of each row (Vehtari et al. 2024, PSIS).

    Parameters
    ----------
    log_weights
        (rows, draws): log importance ratios of independent draws (``reff = 1``).

    Returns
    -------
    numpy.ndarray
        One k-hat per row. Above 0.7 the weights' tail is too heavy for a reliable importance-sampling estimate,
        whatever its reported standard error; ``inf`` where a row has too few draws to fit the tail (unreliable too).

    """
    values = np.asarray(log_weights, dtype=np.float64)
    with warnings.catch_warnings():
        # arviz warns once per call about rows whose tail is too short or too heavy; k-hat reports both
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        _, khat = az.psislw(values, reff=1.0)
    return np.asarray(khat, dtype=np.float64).reshape(values.shape[:-1])


def rank_rhat(draws: np.ndarray) -> np.ndarray:
    """Rank-normalised split R-hat of each parameter of (chains, draws, parameters), without the ESS."""
    data = az.convert_to_dataset({"q": np.asarray(draws, dtype=np.float64)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return az.rhat(data, method="rank")["q"].to_numpy()


def rhat_ess(draws: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rank-normalised split R-hat, bulk ESS and tail ESS of each parameter.

    Parameters
    ----------
    draws
        (chains, draws, parameters).

    Returns
    -------
    rhat, ess_bulk, ess_tail
        One value per parameter.

    """
    data = az.convert_to_dataset({"q": np.asarray(draws, dtype=np.float64)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        rhat = az.rhat(data, method="rank")["q"].to_numpy()
        bulk = az.ess(data, method="bulk")["q"].to_numpy()
        tail = az.ess(data, method="tail")["q"].to_numpy()
    return rhat, bulk, tail
