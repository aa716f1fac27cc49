"""Known answers for the maps between two fits: exact affine and signed-permutation relations are recovered."""

import numpy as np
import pytest
from diagnostics_helpers import random_rotation

from countvae.diagnostics.analyses.maps import ICAAxes, PairMaps, fit_map, fit_signed_permutation


def _laplace(n=2000, d=3, seed=0):
    return np.random.default_rng(seed).laplace(0.0, 1.0 / np.sqrt(2.0), (n, d))


def test_linear_map_recovers_an_exact_affine_relation():
    """z_b = z_a A + c exactly: least squares with an intercept returns A and c."""
    rng = np.random.default_rng(0)
    za = rng.normal(size=(300, 3))
    a, c = rng.normal(size=(3, 3)), np.array([5.0, -2.0, 7.0])
    m = fit_map("linear", za, za @ a + c)
    np.testing.assert_allclose(m.matrix, a, atol=1e-10)
    np.testing.assert_allclose(m.offset, c, atol=1e-10)


def test_signed_permutation_is_found_on_uncentred_latents():
    """Columns matched by correlation, not by raw cosine: a common offset of 5 must not hide the permutation."""
    z = _laplace(d=4)
    p = np.zeros((4, 4))
    p[[0, 1, 2, 3], [2, 0, 3, 1]] = [1.0, -1.0, -1.0, 1.0]
    np.testing.assert_array_equal(fit_signed_permutation(z + 5.0, z @ p + 5.0), p)
    m = fit_map("permutation", z + 5.0, z @ p + 5.0)
    np.testing.assert_allclose(m(z + 5.0), z @ p + 5.0, atol=1e-12)


def test_orthogonal_map_and_its_inverse_on_shifted_rotated_latents():
    """z_b = z_a Q + c: the map is (Q, c), the map back (Q^T, -c Q^T); both take each fit exactly to the other."""
    z = _laplace()
    q, c = random_rotation(3, 5), np.array([1.0, 2.0, -3.0])
    maps = PairMaps({"a": z, "b": z @ q + c})
    forward, back = maps.orthogonal("a", "b"), maps.orthogonal("b", "a")
    np.testing.assert_allclose(forward.matrix, q, atol=1e-10)
    np.testing.assert_allclose(forward.offset, c, atol=1e-10)
    np.testing.assert_allclose(back(z @ q + c), z, atol=1e-10)
    np.testing.assert_allclose(maps.to_reference("b")["a"](z), z @ q + c, atol=1e-10)


def test_ica_map_recovers_a_scaled_signed_permutation():
    """Independent Laplace sources; fit b holds them permuted, sign-flipped, scaled by 2 and shifted by 1.

    The ICA map, fitted from each fit's own ICA axes, is that affine map (up to the ICA's estimation error).
    """
    z = _laplace(n=4000)
    p = np.array([[0.0, -1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    zb = 2.0 * z @ p + 1.0
    maps = PairMaps({"a": z, "b": zb})
    m = maps.map("ica", "a", "b")
    np.testing.assert_allclose(m.matrix, 2.0 * p, atol=0.1)
    assert np.sqrt(np.mean((m(z) - zb) ** 2)) < 0.1 * np.std(zb)
    assert np.sqrt(np.mean((maps.map("ica", "b", "a")(zb) - z) ** 2)) == pytest.approx(0.0, abs=0.05)


def test_ica_map_rescales_sources_that_are_not_of_unit_variance():
    """Axes given by hand: a's sources are z_a, b's are z_b / 3, with z_b = 2 z_a P. Matched, b's sources are
    2/3 of a's, so the scale is 2/3 and the map is P diag(2/3) (3 I) = 2 P, whatever the sources' variance."""
    z = _laplace()
    p = np.array([[0.0, -1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    eye = np.eye(3)
    axes_a = ICAAxes(mean=np.zeros(3), unmixing=eye, mixing=eye)
    axes_b = ICAAxes(mean=np.zeros(3), unmixing=eye / 3.0, mixing=3.0 * eye)
    m = fit_map("ica", z, 2.0 * z @ p, axes_a, axes_b)
    np.testing.assert_allclose(m.matrix, 2.0 * p, atol=1e-12)
    np.testing.assert_allclose(m(z), 2.0 * z @ p, atol=1e-10)
