"""Calibration and the out-of-distribution threshold, fitted on the run's held-out images.

Export calls :func:`fit` after the rebuilt model passed its fingerprint check. With a held-out
slice (``python -m train --holdout N``, ``contract.HOLDOUT_FILE``) it fits the temperature that
minimises the held-out images' negative log-likelihood and the threshold that
``contract.confidence.PASS_RATE`` of their scores pass; without one the probabilities are served
as trained (temperature 1), the score is still served, and no model answers ``in_distribution``.
The test split is never used. What it fitted is the published manifest's
:class:`contract.published.Confidence` section; :func:`outputs` is what the exported graphs compute
from it, in NumPy, for export's checks of every written model.
"""

import numpy as np

from contract import HOLDOUT_FILE, IMAGE_SIZE, OUTPUT_IN_DISTRIBUTION, OUTPUT_OOD_SCORE, OUTPUT_PROBABILITIES
from contract import confidence as rules
from contract import published as publications
from export import read_images

BATCH = 500  # images per call when computing logits


def outputs(confidence, logits):
    """What the exported signatures answer for ``logits`` under ``confidence``: probabilities, ood_score, in_distribution."""
    scores = rules.score(logits)
    out = {OUTPUT_PROBABILITIES: rules.softmax(logits, confidence.temperature).astype(np.float32),
           OUTPUT_OOD_SCORE: scores.astype(np.float32)}
    if confidence.ood.threshold is not None:
        out[OUTPUT_IN_DISTRIBUTION] = rules.in_distribution(scores, confidence.ood.threshold)
    return out


def logits(logits_model, images):
    """float64 logits of uint8 ``images``, in batches, through one traced function (eager calls took a third longer)."""
    import tensorflow as tf

    call = tf.function(lambda x: logits_model(x, training=False), input_signature=[
        tf.TensorSpec([None, IMAGE_SIZE, IMAGE_SIZE, 3], tf.float32)])
    return np.concatenate([np.asarray(call(images[start:start + BATCH].astype(np.float32)), np.float64)
                           for start in range(0, len(images), BATCH)])


def fit(logits_model, manifest, run_dir):
    """The :class:`contract.published.Confidence` of the run in ``run_dir``, fitted on its held-out images when it has them."""
    method = dict(method=rules.METHOD, higher_is="more foreign", definition="-logsumexp(logits), the logits at temperature 1")
    if manifest.holdout is None:
        return publications.Confidence(
            temperature=1.0, calibrated=False, ood=publications.Ood(**method, threshold=None),
            why="the run kept no training images out of training (python -m train --holdout N), and the "
                "test split is never used to fit anything")
    images, labels = read_images(run_dir, manifest.holdout)
    z = logits(logits_model, images)
    fitted = rules.fit_temperature(z, labels)
    scores = rules.score(z)
    threshold = rules.threshold_for(scores)
    why = None
    if fitted in rules.TEMPERATURE_RANGE:
        # The NLL still falls at the end of the search: no temperature minimises it (every held-out
        # image right with room to spare, or every one wrong). Any choice would be arbitrary.
        temperature = 1.0
        why = (f"no temperature in {list(rules.TEMPERATURE_RANGE)} minimises the held-out images' NLL (it falls "
               f"all the way to {fitted:g}), so the probabilities are served as trained")
    else:
        temperature = fitted
    before, after = rules.softmax(z), rules.softmax(z, temperature)
    return publications.Confidence(
        temperature=float(temperature), calibrated=why is None, why=why,
        fitted_on=publications.FittedOn(file=HOLDOUT_FILE, images=int(len(labels)), sha256=manifest.holdout.sha256),
        fitted=publications.FittedTemperature(temperature=float(fitted), search_range=list(rules.TEMPERATURE_RANGE)),
        held_out=publications.HeldOut(
            accuracy=float(np.mean(before.argmax(axis=1) == labels)),
            nll=publications.BeforeAfter(before=rules.nll(z, labels), after=rules.nll(z, labels, temperature)),
            ece=publications.Ece(before=rules.expected_calibration_error(before, labels),
                              after=rules.expected_calibration_error(after, labels), bins=rules.ECE_BINS)),
        ood=publications.Ood(**method, threshold=threshold, pass_rate=rules.PASS_RATE,
                          held_out_passing=float(np.mean(rules.in_distribution(scores, threshold)))),
    )
