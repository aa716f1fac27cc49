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


def test_infoc_counts_a_source_spread_over_two_latents_and_ignores_inactive_ones():
    """Known answer: source 0 is carried by latent 0 alone, source 1 by latents 1 and 2 equally (two noisy copies),
    and three inactive latents follow. NMI is then about [[1, 0, 0], [0, 1, 1]] over the active latents, so
    InfoM = 1 (each latent informs one source) and InfoC = ((1 + 1/2) / 2 - 1/3) / (1 - 1/3) = 0.625 (L = 3 active
    latents). Fails if the InfoM and InfoC axes are swapped (InfoM 0.5, InfoC 1) or if InfoC normalizes by all six
    latents (0.70)."""
    rng = np.random.default_rng(20)
    n = 2000
    s = rng.integers(0, 4, (n, 2))
    copies = [s[:, 0] + 0.05 * rng.standard_normal(n), s[:, 1] + 0.05 * rng.standard_normal(n)]
    copies.append(-2.0 * s[:, 1] + 0.1 * rng.standard_normal(n))
    latents = np.column_stack([*copies, 1e-3 * rng.standard_normal((n, 3))])
    result = metrics.infomec(latents, s)
    np.testing.assert_array_equal(result.active, [True] * 3 + [False] * 3)
    assert result.infom == pytest.approx(1.0, abs=0.02)
    assert result.infoc == pytest.approx(0.625, abs=0.02)


def test_infom_scores_an_uninformative_active_latent_as_uniform():
    """Known answer: two latents each carry one of two sources and a third, active latent is independent noise
    whose estimated NMI with both sources is exactly 0. Its share is then 1/K = 1/2 (uninformative, not modular), so
    InfoM = ((1 + 1 + 1/2) / 3 - 1/2) / (1 - 1/2) = 2/3. Fails if a latent without information counts as fully
    modular (InfoM 1)."""
    rng = np.random.default_rng(20)
    n = 2000
    s = rng.integers(0, 4, (n, 2))
    aligned = s + 0.05 * rng.standard_normal((n, 2))
    noise = np.random.default_rng(4).uniform(0, 3, n)
    result = metrics.infomec(np.column_stack([aligned, noise]), s)
    assert result.active.all()
    np.testing.assert_array_equal(result.nmi["z_2"].to_numpy(), 0.0)  # the premise: no information at all
    assert result.infom == pytest.approx(2.0 / 3.0, abs=0.02)


def test_infoe_is_the_mean_over_sources():
    """Known answer: source 0 is decodable from the latents (explicitness 1) and source 1 is independent of them
    (explicitness 0), so InfoE = (1 + 0) / 2 = 0.5. Fails if the per-source scores are combined by max or min."""
    rng = np.random.default_rng(21)
    n = 2000
    s = rng.integers(0, 4, (n, 2))
    latents = np.column_stack([s[:, 0] + 0.05 * rng.standard_normal(n), rng.standard_normal(n)])
    result = metrics.infomec(latents, s)
    np.testing.assert_allclose(result.infoe_per_source.to_numpy(), [1.0, 0.0], atol=0.01)
    assert result.infoe == pytest.approx(0.5, abs=0.01)


class _FixedImportanceForest:
    """Stands in for the random forest in :func:`metrics.dci`: returns preset importances, one column per source."""

    columns: list[np.ndarray] = []

    def __init__(self, **kwargs):
        pass

    def fit(self, x, y):
        self.feature_importances_ = type(self).columns.pop(0)
        self._label = np.bincount(y).argmax()
        return self

    def predict(self, x):
        return np.full(x.shape[0], self._label)


def test_dci_disentanglement_and_completeness_formulas(monkeypatch):
    """Known answer from preset importances (3 latents, 2 sources): R = [[0.6, 0], [0.4, 0.5], [0, 0.5]].
    Latent weights rho = row sums / 2 = (0.3, 0.45, 0.25); per-latent 1 - H_2(row) = 1, 1 - H_2(4/9, 5/9), 1, so
    D = 0.3 + 0.45 (1 - H_2(4/9, 5/9)) + 0.25. Source weights 1/2 each; per-source 1 - H_3(column) =
    1 - H_3(0.6, 0.4) and 1 - H_3(1/2, 1/2), so C = (2 - H_3(0.6, 0.4) - log 2 / log 3) / 2. Fails on a wrong
    entropy base (natural, or K for C), a wrong axis, or weights that are not normalized."""
    import sklearn.ensemble

    monkeypatch.setattr(sklearn.ensemble, "RandomForestClassifier", _FixedImportanceForest)
    monkeypatch.setattr(_FixedImportanceForest, "columns", [np.array([0.6, 0.4, 0.0]), np.array([0.0, 0.5, 0.5])])
    rng = np.random.default_rng(22)
    result = metrics.dci(rng.standard_normal((200, 3)), rng.integers(0, 3, (200, 2)))

    def h(p, base):
        p = np.asarray(p, dtype=float)
        p = p[p > 0]
        return float(-np.sum(p * np.log(p)) / np.log(base))

    expected_d = 0.3 + 0.45 * (1.0 - h([4 / 9, 5 / 9], 2)) + 0.25
    expected_c = (2.0 - h([0.6, 0.4], 3) - np.log(2) / np.log(3)) / 2.0
    assert expected_d == pytest.approx(0.5540, abs=1e-4) and expected_c == pytest.approx(0.3782, abs=1e-4)  # by hand
    assert result.disentanglement == pytest.approx(expected_d, abs=1e-8)
    assert result.completeness == pytest.approx(expected_c, abs=1e-8)
    np.testing.assert_array_equal(result.importance.to_numpy(), [[0.6, 0.0], [0.4, 0.5], [0.0, 0.5]])


def test_dci_informativeness_is_held_out_accuracy():
    """Known answer: latents independent of four balanced labels give a held-out accuracy at chance, 1/4 (a depth-10
    forest fits its training cells far better). Fails if the accuracy is measured on the training cells."""
    rng = np.random.default_rng(23)
    result = metrics.dci(rng.standard_normal((2000, 3)), rng.integers(0, 4, (2000, 1)), n_estimators=20)
    assert result.informativeness == pytest.approx(0.25, abs=0.08)


def test_group_variance_within_finds_a_batch_effect_of_opposite_sign_in_each_type():
    """Known answer: a balanced 2 x 2 design (cell type x batch) where the feature is +1 when the batch equals the
    type and -1 otherwise. Batch means are both 0 (v = 0 without ``within``); inside each type the batch means are
    +1 and -1, so the variance of the label means within types is exactly 1. Fails if, after centring within types,
    the means are taken over batches only."""
    cell_type = np.repeat([0, 0, 1, 1], 50)
    batch = np.repeat([0, 1, 0, 1], 50)
    feature = np.where(cell_type == batch, 1.0, -1.0)[:, None]
    np.testing.assert_allclose(metrics.group_variance(feature, batch), [0.0], atol=1e-12)
    np.testing.assert_allclose(metrics.group_variance(feature, batch, within=cell_type), [1.0], rtol=1e-12)


def test_concentration_rounds_the_number_of_top_features_up():
    """Known answer: two balanced groups and features = group * (3, 2, 1), so v = (9, 4, 1) / 4. The top
    ceil(0.5 * 3) = 2 features carry 13/14, the top ceil(0.25 * 3) = 1 carries 9/14. Fails if the count is rounded
    down (9/14 and 0)."""
    groups = np.repeat([0, 1], 50)
    features = groups[:, None] * np.array([3.0, 2.0, 1.0])
    np.testing.assert_allclose(metrics.group_variance(features, groups), np.array([9.0, 4.0, 1.0]) / 4, rtol=1e-12)
    assert metrics.concentration(features, groups, top_fraction=0.5) == pytest.approx(13 / 14, rel=1e-12)
    assert metrics.concentration(features, groups, top_fraction=0.25) == pytest.approx(9 / 14, rel=1e-12)


def test_active_latents_are_judged_against_the_largest_iqr():
    """Known answer: latents with interquartile ranges in the ratio 1 : 0.2 : 0.05 are active, active, inactive at
    the default 0.1 of the largest (0.05 < 0.1 < 0.2); against the mean IQR (0.42) the third would pass."""
    rng = np.random.default_rng(24)
    s = rng.integers(0, 3, (1000, 3))
    result = metrics.infomec((s + 0.3 * rng.standard_normal(s.shape)) * np.array([1.0, 0.2, 0.05]), s)
    np.testing.assert_array_equal(result.active, [True, True, False])


def test_normalized_gini_of_all_zeros_is_undefined():
    """0 / 0: every value zero has no Gini coefficient, rather than a NaN passed on."""
    with pytest.raises(InvalidDataError, match="every value is zero"):
        metrics.normalized_gini(np.zeros(4))


def test_mcc_is_the_mean_over_matched_pairs():
    """Known answer: latents = (s0, the plane (s1, s2) rotated by a); the matched |correlations| are 1, cos a, cos a
    (exactly, for white sources), so MCC = (1 + 2 cos a) / 3, not their median cos a."""
    rng = np.random.default_rng(25)
    s = rng.laplace(size=(3000, 3))
    s = (s - s.mean(0)) / s.std(0)
    s = s @ np.linalg.inv(np.linalg.cholesky(np.cov(s.T, bias=True))).T  # exactly white
    a = 0.4
    plane = s[:, 1:] @ np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]]).T
    assert metrics.mcc(np.column_stack([s[:, 0], plane]), s) == pytest.approx((1 + 2 * np.cos(a)) / 3, abs=1e-10)


def test_batch_mixing_by_hand_and_at_the_extremes():
    # cells 0, 1 in batch a and 2, 3 in batch b: a random other cell is of another batch with probability 2/3
    neighbours = np.array([[1, 2], [0, 3], [3, 0], [2, 1]])
    scores = metrics.batch_mixing(neighbours, ["a", "a", "b", "b"])
    np.testing.assert_allclose(scores, [0.75, 0.75, 0.75, 0.75])  # half of the neighbours over 2/3
    from countvae.diagnostics.analyses.subspace import knn_sets

    rng = np.random.default_rng(0)
    apart = np.vstack([rng.normal(size=(200, 2)), rng.normal(size=(100, 2)) + 50.0])
    labels = np.repeat(["a", "b"], [200, 100])
    assert np.all(metrics.batch_mixing(knn_sets(apart, 15), labels) == 0.0)
    # batch drawn independently of position: the mean is 1 up to sampling (3,000 cells, sd about 0.01)
    z = rng.normal(size=(3000, 3))
    random_labels = rng.choice(["a", "b", "c"], size=3000, p=[0.5, 0.3, 0.2])
    assert metrics.batch_mixing(knn_sets(z, 15), random_labels).mean() == pytest.approx(1.0, abs=0.04)
    # only the neighbour sets count: a rotated latent space mixes the same
    rotated = z @ ortho_group.rvs(3, random_state=1)
    np.testing.assert_array_equal(
        metrics.batch_mixing(knn_sets(rotated, 15), random_labels), metrics.batch_mixing(knn_sets(z, 15), random_labels)
    )


def test_batch_mixing_of_query_cells_among_more_cells():
    # two query cells (batch a) whose neighbours are among 6 cells (2 of a, 4 of b): expected share 4/5
    neighbours = np.array([[2, 3, 1], [4, 0, 5]])
    scores = metrics.batch_mixing(neighbours, ["a", "a", "b", "b", "b", "b"])
    np.testing.assert_allclose(scores, [(2 / 3) / (4 / 5), (2 / 3) / (4 / 5)])


def test_batch_mixing_refuses_what_it_cannot_score():
    with pytest.raises(InvalidDataError, match="at least two batches"):
        metrics.batch_mixing(np.array([[1], [0]]), ["a", "a"])
    with pytest.raises(InvalidDataError, match="missing values"):
        metrics.batch_mixing(np.array([[1], [0]]), np.array(["a", None], dtype=object))
    with pytest.raises(InvalidDataError, match="point outside"):
        metrics.batch_mixing(np.array([[1], [5]]), ["a", "b"])
    with pytest.raises(InvalidDataError, match="integer indices"):
        metrics.batch_mixing(np.array([[0.5], [1.0]]), ["a", "b"])


def test_mcc_names_its_own_arguments_when_their_cells_differ():
    # it said "a has 90 cells but b has 100" for latents of 100 cells and sources of 90: match_components' names
    rng = np.random.default_rng(0)
    with pytest.raises(InvalidDataError, match="latents has 100 cells but sources has 90"):
        metrics.mcc(rng.normal(size=(100, 2)), rng.normal(size=(90, 2)))


def test_infomec_refuses_a_source_with_one_cell_per_level():
    """scikit-learn's k-NN estimate leaves single-cell levels out, and with every level single it raised about an
    array of 0 samples."""
    z = np.random.default_rng(0).normal(size=(10, 2))
    with pytest.raises(InvalidDataError, match="10 levels over 10 cells, one cell each"):
        metrics.infomec(z, metrics.discretize(z, n_bins=10))
    assert np.isfinite(metrics.infomec(z, metrics.discretize(z, n_bins=5)).infom)


def test_explicitness_checks_its_arguments():
    """Each gave scikit-learn's or numpy's own error, and max_iter=0 returned a number."""
    z = np.random.default_rng(0).normal(size=(200, 3))
    codes = metrics.discretize(z[:, :1], n_bins=4)[:, 0]
    with pytest.raises(InvalidDataError, match="latents has 200 cells but codes has 10"):
        metrics.explicitness(z, codes[:10])
    with pytest.raises(InvalidDataError, match="non-integer values; this metric needs discrete sources"):
        metrics.explicitness(z, z[:, 0])
    with pytest.raises(InvalidDataError, match="single value"):
        metrics.explicitness(z, np.zeros(200, dtype=int))
    with pytest.raises(InvalidArgumentError, match="max_iter"):
        metrics.explicitness(z, codes, max_iter=0)
    # labels as strings are the same source as their integer codes
    strings = np.array(["a", "b", "c", "d"])[codes]
    assert metrics.explicitness(z, strings) == pytest.approx(metrics.explicitness(z, codes))


def test_infoe_uses_every_latent_including_an_inactive_one_that_carries_the_source() -> None:
    """A binary source carried only by a small-scale latent: InfoE is its explicitness from all latents, near 1.

    z_0 is unit Gaussian noise; z_1 = 0.05 (s + 0.1 noise), so its IQR is far below the activity rule's (z_1 is
    inactive) yet its two levels are 10 noise sd apart: a linear classifier on all latents decodes s almost
    perfectly (explicitness about 0.9999). Catches InfoE computed from the active latents only (then about 0, since
    z_0 says nothing of s); InfoM and InfoC, which are documented to use the active latents, are not checked here.
    """
    rng = np.random.default_rng(0)
    s = rng.integers(0, 2, 400)
    z = np.column_stack([rng.normal(size=400), 0.05 * (s + 0.1 * rng.normal(size=400))])
    result = metrics.infomec(z, s[:, None])
    assert result.active.tolist() == [True, False]
    assert result.infoe == pytest.approx(metrics.explicitness(z, s), abs=1e-12)
    assert result.infoe > 0.99
