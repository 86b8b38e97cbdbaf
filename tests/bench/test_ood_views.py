"""bench/research/ood_views.py: scores of airbench's six test-time views, on logits whose answers are known and on a real model."""

import numpy as np

from bench.research import ood_views

WEIGHTS = np.array([0.25, 0.125, 0.125] * 2)


def logsumexp(z):
    return np.log(np.exp(z).sum(axis=-1))


def test_views_that_agree_score_as_one_view():
    logits = np.array([[2.0, 0.0, -1.0], [0.5, 0.5, 0.5]])
    made = ood_views.view_scores(np.repeat(logits[None], 6, axis=0))
    np.testing.assert_allclose(made["energy"], -logsumexp(logits))
    np.testing.assert_allclose(made["views' mean energy"], -logsumexp(logits))
    np.testing.assert_allclose(made["views' agreement"], [0.0, 0.0])


def test_scores_of_views_that_differ():
    rng = np.random.default_rng(0)
    views = rng.normal(size=(6, 5, 3)) * 3
    made = ood_views.view_scores(views)
    averaged = np.einsum("v,vbc->bc", WEIGHTS, views)
    np.testing.assert_allclose(made["energy"], -logsumexp(averaged))
    np.testing.assert_allclose(made["views' mean energy"], -(WEIGHTS @ logsumexp(views)))
    spread = sum(w * ((v - averaged) ** 2).sum(axis=1) for w, v in zip(WEIGHTS, views))
    np.testing.assert_allclose(made["views' agreement"], -spread)
    # logsumexp is convex, so the views' mean energy is never above the energy of their averaged logits
    assert np.all(made["views' mean energy"] <= made["energy"] + 1e-12)


def test_the_views_average_to_the_models_served_logits():
    import keras

    from train import models

    keras.mixed_precision.set_global_policy("float32")
    model = models.build_model("airbench_muon", 10)
    images = np.random.default_rng(1).integers(0, 256, size=(4, 32, 32, 3)).astype(np.uint8)
    views = ood_views.view_logits(model)(images)
    assert views.shape == (6, 4, 10)
    served = np.asarray(models.logits_model(model)(images.astype(np.float32), training=False), np.float64)
    np.testing.assert_allclose(np.einsum("v,vbc->bc", WEIGHTS, views), served, rtol=1e-5, atol=1e-5)
    # the views are not all one image: the shifts and flips change the logits
    assert np.abs(views - views[0]).max() > 1e-4
