"""bench/research/ood_scores.py, the feature-space out-of-distribution scores: on synthetic features whose answers are known."""

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from bench.research import ood_scores as scores

DIM = 8
#: The shared within-class standard deviation along each axis: wide on the first, narrow on the last.
SPREAD = np.array([10.0, 5.0, 3.0, 2.0, 1.0, 1.0, 0.5, 0.2])
MEANS = np.array([[40.0, 0, 0, 0, 0, 0, 0, 0], [0, 30.0, 0, 0, 0, 0, 0, 0], [0, 0, 20.0, 0, 0, 0, 0, 0]])


def gaussian_classes(per_class, seed):
    """``(features, labels)``: three Gaussian classes around MEANS with the covariance diag(SPREAD**2)."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(len(MEANS)), per_class)
    return MEANS[labels] + rng.normal(size=(len(labels), DIM)) * SPREAD, labels


def auroc(inside, outside):
    """As bench/confidence/ood.py's ``detection``: the foreign images are the positive class, a higher score more foreign."""
    return roc_auc_score(np.r_[np.zeros(len(inside)), np.ones(len(outside))], np.r_[inside, outside])


def test_mahalanobis_is_the_known_distance_to_the_nearest_class_mean():
    features, labels = gaussian_classes(20000, seed=0)
    mahalanobis = scores.Mahalanobis(features, labels, len(MEANS))
    # Standardised steps from class 2's mean: 3 sd along the wide axis, 2 sd along the narrow one.
    probes = MEANS[2] + np.array([3 * SPREAD[0] * np.eye(DIM)[0], 2 * SPREAD[-1] * np.eye(DIM)[-1], np.zeros(DIM)])
    np.testing.assert_allclose(mahalanobis(probes), [9.0, 4.0, 0.0], atol=0.15)
    # The Euclidean distance would rank these the other way round (30 against 0.4): the covariance counts.
    assert mahalanobis(probes)[0] > mahalanobis(probes)[1]


def test_mahalanobis_of_in_distribution_features_is_chi_square_and_foreign_ones_score_higher():
    features, labels = gaussian_classes(5000, seed=0)
    mahalanobis = scores.Mahalanobis(features, labels, len(MEANS))
    inside, _ = gaussian_classes(500, seed=1)
    # The squared distance of a Gaussian point to its own mean is chi-square with DIM degrees of
    # freedom (mean DIM); the nearest mean can only make it smaller.
    assert 0.9 * DIM < np.mean(mahalanobis(inside)) <= 1.02 * DIM
    rng = np.random.default_rng(2)
    # Foreign: near class 0's mean on the wide axes, but 5 sd out along the narrow ones.
    outside = MEANS[0] + np.concatenate([rng.normal(size=(500, 4)) * SPREAD[:4], 5 * SPREAD[4:] * rng.choice([-1, 1], (500, 4))], axis=1)
    assert auroc(mahalanobis(inside), mahalanobis(outside)) > 0.99
    # The same features nearer the origin than any class, as a featureless image gives.
    assert auroc(mahalanobis(inside), mahalanobis(rng.normal(size=(500, DIM)))) > 0.95


def test_mahalanobis_needs_every_class():
    features, labels = gaussian_classes(10, seed=0)
    with pytest.raises(ValueError, match=r"classes \[2\]"):
        scores.Mahalanobis(features[labels < 2], labels[labels < 2], len(MEANS))


def test_knn_is_the_distance_to_the_kth_nearest_normalised_bank_feature():
    angles = np.radians([0, 10, 30, 90])
    bank = np.stack([np.cos(angles), np.sin(angles)], axis=1) * [[1], [2], [3], [4]]  # norms do not count
    query = np.array([[5.0, 0.0]])
    for k, angle in zip(range(1, 5), angles):
        expected = 2 * np.sin(angle / 2)  # the chord between two unit vectors
        np.testing.assert_allclose(scores.KNN(bank, k)(query), [expected], atol=1e-6)
    np.testing.assert_allclose(scores.KNN(bank, 2)(query * 7), scores.KNN(bank, 2)(query), atol=1e-7)


def test_knn_ranks_foreign_directions_above_the_training_ones():
    features, _ = gaussian_classes(2000, seed=0)
    knn = scores.KNN(features, k=10)
    inside, _ = gaussian_classes(300, seed=1)
    outside = np.random.default_rng(3).normal(size=(300, DIM)) * 20 * np.r_[0, 0, 0, 1, 1, 1, 1, 1]
    assert auroc(knn(inside), knn(outside)) > 0.99


def test_knn_refuses_a_k_the_bank_cannot_give():
    with pytest.raises(ValueError, match="k must be from 1 to the bank's 3 features"):
        scores.KNN(np.ones((3, 2)), 4)


def test_affine_head_is_recovered_with_its_bias():
    rng = np.random.default_rng(0)
    features, w, b = rng.normal(size=(200, 6)), rng.normal(size=(6, 3)), rng.normal(size=3)
    found_w, found_b, error = scores.affine_head(features, features @ w + b)
    np.testing.assert_allclose(found_w, w, atol=1e-9)
    np.testing.assert_allclose(found_b, b, atol=1e-9)
    assert error < 1e-9


def subspace_features(count, seed, outside=0.0):
    """Features in the first 4 of 8 axes (plus ``outside`` of noise in the other 4), and a head that reads them."""
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.normal(size=(count, 4)) * 3 + 2, rng.normal(size=(count, 4)) * (0.01 + outside)], axis=1)
    return x


def test_vim_origin_is_where_the_head_gives_zero_logits():
    rng = np.random.default_rng(0)
    w, b = rng.normal(size=(8, 3)), rng.normal(size=3)
    vim = scores.ViM(subspace_features(4000, seed=1), w, b, dim=4)
    np.testing.assert_allclose(vim.origin @ w + b, 0, atol=1e-9)
    np.testing.assert_allclose(scores.ViM(subspace_features(100, seed=1), w, np.zeros(3), dim=4).origin, 0)


def test_vim_residual_is_the_part_outside_the_principal_subspace_and_alpha_matches_the_logits():
    w = np.random.default_rng(0).normal(size=(8, 3))
    train = subspace_features(4000, seed=1)
    vim = scores.ViM(train, w, np.zeros(3), dim=4)
    probe = np.r_[5.0, -1.0, 2.0, 0.5, 0, 0, 3.0, 4.0]  # a 3-4-5 triangle outside the subspace
    np.testing.assert_allclose(vim.residual(probe[None]), [5.0], atol=0.01)
    np.testing.assert_allclose(vim.alpha, np.mean((train @ w).max(axis=1)) / np.mean(vim.residual(train)))
    np.testing.assert_allclose(vim(probe[None]), vim.alpha * vim.residual(probe[None]) + scores.energy(probe[None] @ w))


def test_vim_scores_features_off_the_principal_subspace_as_foreign():
    rng = np.random.default_rng(0)
    w = np.concatenate([rng.normal(size=(4, 3)), np.zeros((4, 3))])  # the logits ignore the residual
    vim = scores.ViM(subspace_features(4000, seed=1), w, np.zeros(3), dim=4)
    inside, outside = subspace_features(500, seed=2), subspace_features(500, seed=3, outside=1.0)
    # Their logits have the same distribution: the energy alone cannot tell them apart, ViM can.
    assert abs(auroc(scores.energy(inside @ w), scores.energy(outside @ w)) - 0.5) < 0.1
    assert auroc(vim(inside), vim(outside)) > 0.99


def test_vim_refuses_a_subspace_as_wide_as_the_features():
    with pytest.raises(ValueError, match="from 1 to 7 dimensions"):
        scores.ViM(subspace_features(100, 0), np.ones((8, 2)), np.zeros(2), dim=8)


def test_energy_is_minus_logsumexp():
    logits = np.array([[0.0, 0.0], [1000.0, 0.0]])
    np.testing.assert_allclose(scores.energy(logits), [-np.log(2), -1000.0])


def test_fusion_adds_the_scores_standardised_on_the_reference():
    a, b = np.array([1.0, 2.0, 3.0]), np.array([10.0, 30.0, 50.0])
    fusion = scores.Fusion([a, b])
    np.testing.assert_allclose(fusion([a, b]), 2 * (a - 2) / np.std(a))
    np.testing.assert_allclose(fusion([np.array([2.0]), np.array([70.0])]), [0 + 40 / np.std(b)])
    with pytest.raises(ValueError, match="2 scores were fitted, 1 given"):
        fusion([a])


def test_fusion_weighs_each_standardised_score():
    a, b = np.array([1.0, 2.0, 3.0]), np.array([10.0, 30.0, 50.0])
    fusion = scores.Fusion([a, b], weights=[1.0, -0.5])
    np.testing.assert_allclose(fusion([np.array([3.0]), np.array([50.0])]),
                               [(3 - 2) / np.std(a) - 0.5 * (50 - 30) / np.std(b)])
    with pytest.raises(ValueError, match="2 scores, 1 weights"):
        scores.Fusion([a, b], weights=[1.0])


def test_energy_at_a_temperature_is_minus_t_logsumexp_of_the_logits_over_t():
    logits = np.array([[0.0, np.log(3.0)]])
    np.testing.assert_allclose(scores.energy(logits, 1.0), [-np.log(4.0)])
    np.testing.assert_allclose(scores.energy(logits, 2.0), [-2 * np.log(1 + np.sqrt(3.0))])
    # A high temperature ranks by the mean logit, a low one by the largest: the two orders differ here.
    pair = np.array([[5.0, 5.0, 5.0], [6.0, 0.0, 0.0]])
    assert scores.energy(pair, 100.0)[0] < scores.energy(pair, 100.0)[1]
    assert scores.energy(pair, 0.1)[0] > scores.energy(pair, 0.1)[1]


def test_gen_is_the_generalized_entropy_of_the_top_m_probabilities():
    probabilities = np.array([[0.7, 0.2, 0.1]])
    logits = np.log(probabilities) + 3.0  # a shift changes no probability
    np.testing.assert_allclose(scores.gen(logits, gamma=1.0, m=2), [0.7 * 0.3 + 0.2 * 0.8])
    np.testing.assert_allclose(scores.gen(logits, gamma=0.5, m=3), [np.sum(np.sqrt(probabilities * (1 - probabilities)))])
    # Higher is more foreign: flat logits above a confident answer, a certain one at zero.
    flat, sure, certain = scores.gen(np.array([[1.0, 1.0, 1.0], [4.0, 0.0, 0.0], [800.0, 0.0, 0.0]]), 0.1, 3)
    assert flat > sure > certain == 0.0


def test_react_with_a_clip_above_every_activation_is_the_energy_and_a_lower_clip_cuts_the_largest():
    rng = np.random.default_rng(0)
    train, w, b = rng.exponential(size=(500, 6)), rng.normal(size=(6, 3)), rng.normal(size=3)
    react = scores.ReAct(train, w, b, percentile=100)
    assert react.clip == train.max()
    np.testing.assert_allclose(react(train[:20]), scores.energy(train[:20] @ w + b))
    low = scores.ReAct(train, w, b, percentile=50)
    np.testing.assert_allclose(low.clip, np.median(train))
    x = np.array([[0.1, 5.0, 0.2, 9.0, 0.0, 0.3]])
    np.testing.assert_allclose(low(x), scores.energy(np.minimum(x, np.median(train)) @ w + b))


def test_scale_and_ash_shape_each_row_by_its_own_percentile():
    x = np.array([[1.0, 2.0, 3.0, 4.0], [40.0, 30.0, 20.0, 10.0]])
    # The median of 1..4 is 2.5: 3 and 4 are kept, 7 of the row's 10 (and 70 of the second row's 100).
    factor = np.exp(10 / 7)
    np.testing.assert_allclose(scores.scale(x, 50), x * factor)
    np.testing.assert_allclose(scores.ash(x, 50, "p"), [[0, 0, 3, 4], [40, 30, 0, 0]])
    np.testing.assert_allclose(scores.ash(x, 50, "s"), np.array([[0, 0, 3, 4], [40, 30, 0, 0]]) * factor)
    np.testing.assert_allclose(scores.ash(x, 50, "b"), [[0, 0, 5, 5], [50, 50, 0, 0]])
    with pytest.raises(ValueError, match="not 'q'"):
        scores.ash(x, 50, "q")


def test_scale_keeps_the_answer_and_lowers_the_energy_of_rows_whose_mass_is_in_a_few_activations():
    w = np.random.default_rng(0).normal(size=(4, 3))
    peaked, spread = np.array([[8.0, 0.1, 0.1, 0.1]]), np.array([[2.0, 2.1, 2.0, 2.2]])  # the same sum, 8.3
    for x in (peaked, spread):
        assert np.argmax(scores.scale(x, 75) @ w) == np.argmax(x @ w)
    # The 75th percentile keeps one activation each: the peaked row keeps almost all its mass, the
    # spread one about a quarter, so SCALE multiplies the spread row's features by the larger factor.
    assert scores.scale(peaked, 75)[0, 0] / peaked[0, 0] < scores.scale(spread, 75)[0, 0] / spread[0, 0]


def test_fdbd_is_the_mean_distance_to_the_decision_boundaries_over_the_distance_to_the_mean():
    w = np.eye(2)  # two classes; the boundary is the line x0 = x1
    fdbd = scores.FDBD(np.array([[1.0, -1.0], [-1.0, 1.0]]), w, np.zeros(2))  # training mean 0
    x = np.array([[3.0, 1.0]])
    # (3, 1) is |3 - 1| / sqrt(2) = sqrt(2) from the boundary and sqrt(10) from the mean.
    np.testing.assert_allclose(fdbd(x), [-np.sqrt(2) / np.sqrt(10)])
    np.testing.assert_allclose(fdbd(7 * x), fdbd(x))  # about the mean without bias, the size of the feature cancels
    three = scores.FDBD(np.zeros((1, 2)), np.array([[1.0, 0.0, -1.0], [0.0, 1.0, 0.0]]), np.zeros(3))
    # Predicted class 0 (z = 3, 1, -3): boundaries with class 1 (w gap (1, -1)) and class 2 (w gap (2, 0)).
    np.testing.assert_allclose(three(x), [-(2 / np.sqrt(2) + 6 / 2) / 2 / np.sqrt(10)])
    # On the boundary the score is 0, the most foreign it can be.
    assert fdbd(np.array([[2.0, 2.0]]))[0] == 0.0 > fdbd(x)[0]
