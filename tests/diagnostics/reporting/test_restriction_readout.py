"""The restriction comparison's read-out of its fits (``restriction_readout``), on stand-in fits with known answers:
the ICA re-read keeps each cell's linear predictor, each split half is read in ICA axes of its own cells, the
symmetry check reports the measurement that decides each map and confirms only what every check confirms, and the
request refuses fits or cells other than its own."""

from __future__ import annotations

from types import SimpleNamespace

import anndata as ad
import numpy as np
import pandas as pd
import pytest

from countvae.diagnostics.fitting.restrictions import UNRESTRICTED, Restriction, RestrictionFits, split_half_cells
from countvae.diagnostics.reporting import restriction_readout
from countvae.diagnostics.reporting.restriction_readout import (
    SYMMETRY_CHECKS,
    ModelReadout,
    RestrictionRequest,
    _read_split_halves,
    ica_readout,
    symmetry_rows,
)
from countvae.errors import InvalidArgumentError
from countvae.metrics import mcc


# ----- the read-out of the fits, on stand-ins with a known answer -----------------------------------------------
def _stand_in_fit(name, latents_of_cells, held_latents=None, loadings=None, symmetry="orthogonal"):
    """A fit whose model gives ``latents_of_cells[indices]`` for the training cells asked (what ica_axes asks)."""
    model = SimpleNamespace(
        get_latent_representation=lambda adata, indices: latents_of_cells[indices],
        module=SimpleNamespace(symmetry=symmetry, loadings_prior=None),
    )
    return SimpleNamespace(
        name=name, model=model, latent=lambda adata: held_latents, loadings=lambda: loadings, n_latent=2
    )


def test_the_ica_readout_keeps_each_cells_linear_predictor_and_counts_gaussian_components():
    """Known answer: with z = s mixing^T + mean, the re-read sources times the re-read loadings W mixing are the
    latents times the loadings less the training latents' mean, W (z - mean), on every held-out cell.

    Catches the loadings re-read with the transposed mixing matrix (mixing is not orthogonal: whitening scales) and
    sources left in the unrotated coordinates. A second fit whose training latents mix a Laplace and a Gaussian
    source has one component ICA cannot identify: the read-out counts it (the most of any one fit's ICA)."""
    rng = np.random.default_rng(0)
    mixing = np.array([[2.0, 0.5], [-1.0, 1.5]])
    offset = np.array([1.0, -2.0])
    z_fit = rng.laplace(size=(600, 2)) @ mixing.T + offset
    z_held = rng.laplace(size=(80, 2)) @ mixing.T + offset
    one_gaussian = np.column_stack([rng.laplace(size=600), rng.normal(size=600)]) @ mixing.T
    w = rng.normal(size=(20, 2))
    fits = [_stand_in_fit("seed 0", z_fit), _stand_in_fit("seed 1", one_gaussian)]
    latents, loadings = {"seed 0": z_held, "seed 1": z_held}, {"seed 0": w, "seed 1": None}
    unrestricted = ModelReadout(UNRESTRICTED, "orthogonal", {0: 1.0, 1: 1.0}, latents, loadings)
    out = ica_readout(unrestricted, fits, ad.AnnData(np.zeros((600, 1))), seed=0)
    sources, reread = out.latents["seed 0"], out.loadings["seed 0"]
    assert sources.shape == (80, 2) and reread.shape == (20, 2) and out.loadings["seed 1"] is None
    np.testing.assert_allclose(sources @ reread.T, (z_held - z_fit.mean(axis=0)) @ w.T, atol=1e-8)
    assert out.gaussian_components == 1 and out.seconds == {0: 0.0, 1: 0.0}


def test_each_split_half_is_read_in_ica_axes_fitted_on_its_own_cells():
    """Known answer: each half's model places its own training cells as two Laplace sources mixed, and the other
    half's cells as Gaussian noise (no axes to find). Read in ICA axes fitted on its own half, each half's held-out
    coordinates recover the held-out sources (MCC near 1); axes fitted on the other half's cells would not."""
    rng = np.random.default_rng(1)
    n = 1200
    first, second = split_half_cells(n, 0)
    held_sources = rng.laplace(size=(300, 2))
    halves = {}
    for own, name in ((first, "a"), (second, "b")):
        mixing = np.linalg.qr(rng.normal(size=(2, 2)))[0] @ np.diag([1.0, 3.0])
        latents = rng.normal(size=(n, 2)) * 2.0  # Gaussian on the other half's cells
        latents[own] = rng.laplace(size=(len(own), 2)) @ mixing.T
        halves[name] = _stand_in_fit(name, latents, held_latents=held_sources @ mixing.T)
    fitted = SimpleNamespace(
        adata_heldout=None,
        adata_fit=ad.AnnData(np.zeros((n, 1))),
        split_seed=0,
        halves={UNRESTRICTED.name: (halves["a"], halves["b"])},
    )
    readouts = {
        UNRESTRICTED.name: ModelReadout(UNRESTRICTED, "orthogonal", {}),
        "ica": ModelReadout(Restriction("ica"), "orthogonal", {}),
    }
    _read_split_halves(fitted, readouts, seed=0)
    za, zb, _, _ = readouts["ica"].split
    assert mcc(za, held_sources) > 0.95 and mcc(zb, held_sources) > 0.95


def _verify_frame(values):
    """verify()'s table: per map and check, the fitted variant's value, threshold and ok (a control row beside)."""
    rows = [
        {"variant": "fitted", "transform": t, "check": check, "value": v, "threshold": 1.0, "ok": ok}
        for (t, check), (v, ok) in values.items()
    ]
    rows.append({"variant": "control", "transform": "rotation", "check": "control_z", "value": 0.0} | {"ok": False})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("with_loadings", [False, True])
def test_symmetry_rows_give_each_maps_measurement_and_confirm_only_when_every_check_passes(monkeypatch, with_loadings):
    """Hand-made checks of verify(): a rotation that the model should break, a signed permutation and a sign flip it
    should keep. Each row's measurement is the check that decides its expectation (without a loadings prior: the
    common-random-number difference for a kept map, the control z for a broken one; with one: the change of
    log p(x, W), absolute or over its Monte Carlo error); it is confirmed only when every relevant check passes (the
    signed permutation fails one), whatever checks outside SYMMETRY_CHECKS or of other variants say."""
    values = {}
    for k, t in enumerate(("rotation", "signed permutation", "sign flip")):
        for j, check in enumerate(SYMMETRY_CHECKS):
            values[(t, check)] = (10.0 * k + j, not (t == "signed permutation" and check == "joint_abs_change"))
        values[(t, "elbo_refit")] = (99.0, False)  # not a check that decides p(x)
    expected = {"rotation": False, "signed permutation": True, "sign flip": True}
    report_of_verify = SimpleNamespace(
        to_frame=lambda: _verify_frame(values), settings={"expected_invariant": expected}
    )
    monkeypatch.setattr(restriction_readout, "verify", lambda *args, **kwargs: report_of_verify)
    fit = _stand_in_fit("seed 0", None, symmetry="signed permutation")
    fit.model.module.loadings_prior = "horseshoe" if with_loadings else None
    rows = pd.DataFrame(symmetry_rows(fit, "laplace", SimpleNamespace(n_obs=50), seed=0)).set_index("map")
    kept, broken = (
        ("joint_abs_change", "joint_change_over_mc_error") if with_loadings else ("crn_max_abs_diff", "control_z")
    )
    assert rows["measurement"].to_dict() == {"rotation": broken, "signed permutation": kept, "sign flip": kept}
    assert rows.loc["sign flip", "value"] == 20.0 + SYMMETRY_CHECKS.index(kept)
    assert rows.loc["rotation", "value"] == SYMMETRY_CHECKS.index(broken)
    assert rows["p_x_expected"].to_dict() == {
        "rotation": "changes",
        "signed permutation": "unchanged",
        "sign flip": "unchanged",
    }
    assert rows["confirmed"].to_dict() == {"rotation": True, "signed permutation": False, "sign flip": True}


def test_the_request_refuses_other_fits_or_other_held_out_cells():
    """The report's fits must be the request's unrestricted fits themselves, on its held-out cells."""
    held = ad.AnnData(np.zeros((4, 1)))
    held.obs_names = ["c0", "c1", "c2", "c3"]
    f0, f1, g0, g1 = (SimpleNamespace(name=n) for n in ("seed 0", "seed 1", "laplace 0", "laplace 1"))
    fits = RestrictionFits({"unrestricted": [f0, f1], "laplace": [g0, g1]}, {}, {}, held, held)
    request = RestrictionRequest(fits, "laplace")
    assert [r.name for r in request.check([f0, f1], held)] == ["laplace"]
    other = held.copy()
    other.obs_names = ["c0", "c1", "c2", "x"]
    for report_fits, cells in (([f0, f1], other), ([f0, g1], held), ([f1, f0], held)):
        with pytest.raises(InvalidArgumentError, match="not the request's unrestricted fits"):
            request.check(report_fits, cells)
