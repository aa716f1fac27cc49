"""Ground-truth and downstream metrics on constructed cases with known values."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import ortho_group

from countvae import metrics
from countvae.errors import InvalidArgumentError, InvalidDataError


@pytest.fixture(scope="module")
def discrete_case():
    """Four independent discrete sources (4 levels) and latents = sources + noise."""
    rng = np.random.default_rng(0)
    sources = rng.integers(0, 4, (2000, 4))
    latents = sources + 0.5 * rng.standard_normal(sources.shape)
    return sources, latents


def test_infomec_aligned_sources_near_one(discrete_case):
    sources, _ = discrete_case
    latents = sources + 0.05 * np.random.default_rng(1).standard_normal(sources.shape)
    result = metrics.infomec(latents, sources)
    assert result.infom > 0.97 and result.infoc > 0.97 and result.infoe > 0.97
    assert result.nmi.shape == (4, 4) and result.active.all()
    # NMI of a latent with its own source is near 1 and near 0 with the others
    np.testing.assert_allclose(np.diag(result.nmi.to_numpy()), 1.0, atol=0.05)


def test_rotation_lowers_infom_and_infoc_but_not_infoe(discrete_case):
    sources, latents = discrete_case
    aligned = metrics.infomec(latents, sources)
    rotated = metrics.infomec(latents @ ortho_group.rvs(4, random_state=2).T, sources)
    assert 0.5 < aligned.infoe < 0.95  # noisy enough that InfoE is not saturated
    assert rotated.infom < aligned.infom - 0.2
    assert rotated.infoc < aligned.infoc - 0.2
    assert rotated.infoe == pytest.approx(aligned.infoe, abs=2e-3)
    # InfoE is unchanged by any invertible affine map of the latents
    mixing = np.random.default_rng(3).normal(size=(4, 4))
    assert metrics.infomec(latents @ mixing.T + 3.0, sources).infoe == pytest.approx(aligned.infoe, abs=2e-3)


def test_infoe_is_unbiased_for_imbalanced_labels():
    rng = np.random.default_rng(4)
    labels = rng.choice(3, size=5000, p=[0.8, 0.15, 0.05])
    shares = np.bincount(labels) / labels.size
    entropy = -np.sum(shares * np.log(shares))
    assert metrics._entropy(labels) == pytest.approx(entropy, rel=1e-12)
    # latents independent of the labels explain nothing: explicitness ~ 0, not (log 3 - H) / log 3
    noise = rng.standard_normal((5000, 2))
    assert abs(metrics.explicitness(noise, labels)) < 0.01
    balanced_bias = (np.log(3) - entropy) / np.log(3)
    assert balanced_bias > 0.4
    # a perfect predictor explains everything
    perfect = np.eye(3)[labels] + 0.01 * rng.standard_normal((5000, 3))
    assert metrics.explicitness(perfect, labels) > 0.99


def test_infomec_inactive_latent_is_ignored(discrete_case):
    sources, latents = discrete_case
    with_dead = np.column_stack([latents, 1e-3 * np.random.default_rng(5).standard_normal(len(latents))])
    result = metrics.infomec(with_dead, sources)
    np.testing.assert_array_equal(result.active, [True] * 4 + [False])
    assert result.infom == pytest.approx(metrics.infomec(latents, sources).infom, abs=1e-9)


def test_mcc_signed_permutation_is_one_and_rotation_is_cosine():
    rng = np.random.default_rng(6)
    s = rng.laplace(size=(5000, 3))
    signed_perm = s[:, [2, 0, 1]] * np.array([-2.0, 0.5, 3.0])
    assert metrics.mcc(signed_perm, s) == pytest.approx(1.0, abs=1e-12)
    assert metrics.mcc(np.exp(signed_perm / 3), s, method="spearman") == pytest.approx(1.0, abs=1e-12)
    assert metrics.mcc(np.exp(signed_perm / 3), s, method="pearson") < 0.99
    # a rotation by angle a of two uncorrelated unit-variance sources: every |corr| is cos a or sin a
    a = 0.3
    two = (s[:, :2] - s[:, :2].mean(0)) / s[:, :2].std(0)
    two = two @ np.linalg.inv(np.linalg.cholesky(np.cov(two.T, bias=True))).T  # exactly white
    rotated = two @ np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]]).T
    assert metrics.mcc(rotated, two) == pytest.approx(np.cos(a), abs=1e-10)


def test_match_components_reports_signed_pairs():
    rng = np.random.default_rng(7)
    s = rng.standard_normal((1000, 3))
    match = metrics.match_components(s, -s[:, [1, 2, 0]])
    np.testing.assert_array_equal(match.cols[np.argsort(match.rows)], [2, 0, 1])
    np.testing.assert_allclose(match.correlations, -1.0, atol=1e-12)


def test_dci_prefers_aligned_latents(discrete_case):
    sources, _ = discrete_case
    latents = sources + 0.05 * np.random.default_rng(1).standard_normal(sources.shape)
    aligned = metrics.dci(latents, sources, n_estimators=30)
    rotated = metrics.dci(latents @ ortho_group.rvs(4, random_state=8).T, sources, n_estimators=30)
    assert aligned.disentanglement > 0.8
    assert rotated.disentanglement < aligned.disentanglement - 0.3
    assert aligned.completeness > rotated.completeness + 0.3
    assert aligned.informativeness > 0.99
    assert aligned.importance.shape == (4, 4)


def test_normalized_gini_known_values():
    one_hot = np.zeros(8)
    one_hot[3] = 2.0
    assert metrics.normalized_gini(one_hot) == pytest.approx(1.0)
    assert metrics.normalized_gini(np.ones(8)) == pytest.approx(0.0)
    x = np.random.default_rng(9).exponential(size=50)
    pairwise = np.abs(x[:, None] - x[None, :]).sum() / (2 * 50**2 * x.mean()) / (1 - 1 / 50)
    assert metrics.normalized_gini(x) == pytest.approx(pairwise, rel=1e-12)
    with pytest.raises(InvalidDataError, match="non-negative"):
        metrics.normalized_gini(np.array([1.0, -1.0]))


def test_discretize_equal_bins_and_discrete_levels():
    rng = np.random.default_rng(10)
    x = np.column_stack([rng.standard_normal(1000), rng.integers(0, 3, 1000) * 2.5])
    labels = metrics.discretize(x, n_bins=4)
    np.testing.assert_array_equal(np.bincount(labels[:, 0]), [250] * 4)
    np.testing.assert_array_equal(np.unique(labels[:, 1]), [0, 1, 2])
    with pytest.raises(InvalidDataError, match="discretize"):
        metrics.infomec(x, x)


def test_group_variance_and_concentration_closed_forms():
    rng = np.random.default_rng(11)
    n = 4000
    groups = rng.integers(0, 2, n)
    p = groups.mean()
    features = rng.standard_normal((n, 4))
    features[:, 1] += 3.0 * groups  # only feature 1 differs between the groups
    v = metrics.group_variance(features, groups)
    m1, m0 = features[groups == 1, 1].mean(), features[groups == 0, 1].mean()
    assert v[1] == pytest.approx(p * (1 - p) * (m1 - m0) ** 2, rel=1e-10)
    assert metrics.concentration(features, groups, top_fraction=0.25) > 0.99
    # the same variation spread over all four features by an orthogonal map: concentration ~ 1/4..1/2
    spread = features @ ortho_group.rvs(4, random_state=12).T
    assert metrics.concentration(spread, groups) < metrics.concentration(features, groups)
    equal = np.column_stack([groups * 1.0] * 4) + 0.0
    assert metrics.concentration(equal, groups) == pytest.approx(0.25)


def test_group_variance_within_removes_composition():
    rng = np.random.default_rng(13)
    cell_type = rng.integers(0, 2, 3000)
    batch = np.where(rng.random(3000) < 0.8, cell_type, 1 - cell_type)  # batches differ in composition only
    features = np.column_stack([5.0 * cell_type + rng.standard_normal(3000), rng.standard_normal(3000)])
    naive = metrics.group_variance(features, batch)
    within = metrics.group_variance(features, batch, within=cell_type)
    assert naive[0] > 1.0
    assert within[0] < 0.01


def test_metric_input_errors():
    with pytest.raises(InvalidDataError, match="cells"):
        metrics.mcc(np.zeros((10, 2)), np.zeros((11, 2)))
    with pytest.raises(InvalidArgumentError, match="method"):
        metrics.mcc(np.eye(3), np.eye(3), method="kendall")
    with pytest.raises(InvalidDataError, match="single value"):
        metrics.infomec(np.random.default_rng(0).normal(size=(20, 2)), np.zeros((20, 1), dtype=int))
    with pytest.raises(InvalidArgumentError, match="top_fraction"):
        metrics.concentration(np.eye(4), [0, 0, 1, 1], top_fraction=0)


def test_metric_arguments_and_labels_are_checked_not_coerced():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(60, 2))
    labels = np.stack([(z[:, 0] > 0).astype(int), (z[:, 1] > 0).astype(int)], axis=1)
    with pytest.raises(InvalidArgumentError, match="active_iqr_fraction"):
        metrics.infomec(z, labels, active_iqr_fraction=float("nan"))  # was NaN InfoM and InfoC
    with pytest.raises(InvalidArgumentError, match="n_neighbors"):
        metrics.infomec(z, labels, n_neighbors=True)
    with pytest.raises(InvalidArgumentError, match="2 sources"):
        metrics.infomec(z, labels, source_names=[])  # was silently replaced by default names
    with pytest.raises(InvalidDataError, match="missing"):
        metrics.infomec(z, np.where(np.arange(60) == 0, np.nan, labels[:, 0]))  # was "non-integer values"
    with pytest.raises(InvalidArgumentError, match="test_size"):
        metrics.dci(z, labels, test_size=0.0)
    with pytest.raises(InvalidArgumentError, match="n_estimators"):
        metrics.dci(z, labels, n_estimators=True)
    with pytest.raises(InvalidDataError, match="empty"):
        metrics.mcc(np.zeros((10, 0)), np.zeros((10, 0)))  # was NaN
    with pytest.raises(InvalidDataError, match="numeric"):
        metrics.normalized_gini(["a", "b"])
    groups = np.repeat(["a", "b"], 30)
    with pytest.raises(InvalidDataError, match="missing"):
        metrics.group_variance(z, np.where(np.arange(60) == 0, None, groups))  # was NaN for every feature
    with pytest.raises(InvalidDataError, match="missing"):
        metrics.concentration(z, groups, within=np.where(np.arange(60) == 0, None, groups))


def test_concentration_of_a_single_group_is_undefined_not_one():
    # the group means equal the overall means up to rounding; that rounding must not score as concentration 1
    z = np.random.default_rng(1).normal(size=(300, 3))
    with pytest.raises(InvalidDataError, match="do not vary between groups"):
        metrics.concentration(z, np.repeat("a", 300))
    np.testing.assert_allclose(metrics.concentration(z, np.repeat(["a", "b"], 150), top_fraction=1.0), 1.0)


def test_a_constant_column_is_constant_whatever_its_value():
    # 0.1 is not exact in binary: centring leaves rounding residue, which used to pass as variation
    s = np.random.default_rng(2).normal(size=(300, 2))
    for value in (0.1, 1.0 / 3.0):
        with pytest.raises(InvalidDataError, match="constant"):
            metrics.mcc(np.column_stack([s[:, 0], np.full(300, value)]), s)
        with pytest.raises(InvalidDataError, match="constant"):
            metrics.infomec(np.column_stack([s, np.full(300, value)]), (s > 0).astype(int))
