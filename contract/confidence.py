"""How sure an answer is: the held-out slice, temperature scaling, the out-of-distribution score and
its threshold, and the measures that report them. NumPy only; training, export and the benchmarks
share these definitions.

* **Held-out slice.** ``python -m train --holdout N`` keeps N training images out of training,
  chosen by :func:`holdout_indices` (a fixed seed, independent of the training seed), and hands them
  to export in ``contract.HOLDOUT_FILE``. Export fits the temperature and the threshold on them
  and on nothing else: never on the test split.
* **Temperature** (Guo et al., 2017, "On Calibration of Modern Neural Networks"): the served
  probabilities are ``softmax(logits / T)``, with T minimising the negative log-likelihood of the
  held-out labels (:func:`fit_temperature`). One number, so the class ranking never changes.
* **Out-of-distribution score**: the energy of the logits (Liu et al., 2020, "Energy-based
  Out-of-distribution Detection"), ``-logsumexp(logits)`` at temperature 1: low for images like
  the training images, high for foreign ones. It needs only the logits, which every exported
  runtime computes; bench/confidence/ood.py measured it against the maximum probability and the maximum
  logit (docs/benchmarks.md says why it was chosen).
* **Threshold**: the held-out images' score at :data:`PASS_RATE`, so that share of
  in-distribution images is answered ``in_distribution: true`` (:func:`threshold_for`).
"""

import numpy as np

#: Seeds the held-out slice: the same images whatever ``--seed`` trains with.
HOLDOUT_SEED = 1729
#: Share of held-out (in-distribution) images whose score passes the threshold: a real image like the
#: training images is called foreign 2% of the time (at 0.95, one in twenty: the users' complaint), at
#: the cost of fewer foreign images caught (docs/benchmarks.md, the verdict at each pass rate).
PASS_RATE = 0.98
#: Bins of the expected calibration error (equal width in confidence, as Guo et al.).
ECE_BINS = 15
#: The score :func:`score` computes, as the manifest names it.
METHOD = "energy"


def holdout_indices(count, holdout, seed=HOLDOUT_SEED):
    """Sorted indices of the ``holdout`` images kept out of ``count`` training images."""
    if not 0 <= holdout < count:
        raise ValueError(f"the held-out slice must be at least 0 and fewer than the {count} training images, "
                         f"not {holdout}")
    return np.sort(np.random.default_rng(seed).permutation(count)[:holdout])


def log_softmax(logits, temperature=1.0):
    z = np.asarray(logits, np.float64) / temperature
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def softmax(logits, temperature=1.0):
    return np.exp(log_softmax(logits, temperature))


def nll(logits, labels, temperature=1.0):
    """Mean negative log-likelihood of ``labels`` under ``softmax(logits / temperature)``."""
    labels = np.asarray(labels, np.int64)
    return float(-log_softmax(logits, temperature)[np.arange(len(labels)), labels].mean())


#: The range the temperature is searched in. A model that gets every held-out image right with room
#: to spare has no finite best temperature (the NLL falls forever as T shrinks); it gets the bound.
TEMPERATURE_RANGE = (0.05, 20.0)


def fit_temperature(logits, labels, low=TEMPERATURE_RANGE[0], high=TEMPERATURE_RANGE[1], steps=100):
    """The temperature in [low, high] that minimises :func:`nll` on ``(logits, labels)``.

    The NLL is convex in the inverse temperature b (a log-sum-exp of lines in b, minus a line),
    and its derivative, the mean over images of E_p[z] - z_label, is increasing: bisection on its
    sign finds the minimum to float precision in ``steps`` halvings of [1/high, 1/low].
    """
    z = np.asarray(logits, np.float64)
    labels = np.asarray(labels, np.int64)
    if len(z) == 0:
        raise ValueError("no images to fit a temperature on")
    chosen = z[np.arange(len(labels)), labels]

    def slope(b):
        p = softmax(z, 1.0 / b)
        return float(((p * z).sum(axis=1) - chosen).mean())

    lo, hi = 1.0 / high, 1.0 / low
    if slope(lo) >= 0:
        return high
    if slope(hi) <= 0:
        return low
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if slope(mid) < 0 else (lo, mid)
    return 1.0 / ((lo + hi) / 2)


def expected_calibration_error(probabilities, labels, bins=ECE_BINS):
    """Expected calibration error: |accuracy - confidence| per confidence bin, weighted by its share."""
    p = np.asarray(probabilities, np.float64)
    labels = np.asarray(labels, np.int64)
    confidence = p.max(axis=1)
    correct = p.argmax(axis=1) == labels
    # Bin b holds confidences in (b/bins, (b+1)/bins]; a confidence of exactly 0 cannot happen.
    which = np.clip(np.ceil(confidence * bins).astype(np.int64) - 1, 0, bins - 1)
    total = 0.0
    for b in range(bins):
        members = which == b
        if members.any():
            total += members.mean() * abs(correct[members].mean() - confidence[members].mean())
    return float(total)


def score(logits):
    """The out-of-distribution score of each row: its energy, ``-logsumexp(logits)``; higher is more foreign."""
    z = np.asarray(logits, np.float64)
    top = z.max(axis=1)
    return -(top + np.log(np.exp(z - top[:, None]).sum(axis=1)))


def threshold_for(scores, pass_rate=PASS_RATE):
    """The smallest held-out score at or under which at least ``pass_rate`` of ``scores`` lie."""
    ordered = np.sort(np.asarray(scores, np.float64))
    if len(ordered) == 0:
        raise ValueError("no scores to choose a threshold from")
    if not 0 < pass_rate <= 1:
        raise ValueError(f"pass_rate must be in (0, 1], not {pass_rate}")
    return float(ordered[int(np.ceil(pass_rate * len(ordered))) - 1])


def in_distribution(scores, threshold):
    return np.asarray(scores) <= threshold
