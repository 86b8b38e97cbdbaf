"""Out-of-distribution scores of penultimate features, in NumPy and float64: higher is more foreign.

Each score is fitted on features of training images (never the held-out slice nor the test
images) and then maps features (and, where it needs them, logits) to one score per image, in the
direction of ``contract.confidence.score`` (the energy) and of ``bench/confidence/ood.py``'s ``detection``:

* :class:`Mahalanobis` (Lee et al., 2018): the squared distance to the nearest class mean under
  the classes' shared covariance.
* :class:`KNN` (Sun et al., 2022): the distance of the L2-normalised feature to its k-th nearest
  L2-normalised training feature.
* :class:`ViM` (Wang et al., 2022): a virtual logit, the norm of the feature's part outside the
  training features' principal subspace scaled to the logits, against the logits' logsumexp.
* :class:`Fusion`: scores standardised by their mean and spread on the held-out slice, added.

Post-hoc scores of the logits, or of features reshaped and passed through the model's own linear head
(:func:`affine_head`), none of them trained:

* :func:`energy` at a temperature T (Liu et al., 2020): ``-T logsumexp(logits / T)``; T = 1 is what is served.
* :func:`gen` (Liu et al., 2023, "GEN: Pushing the Limits of Softmax-Based Out-of-Distribution
  Detection"): the generalized entropy ``sum p^g (1 - p)^g`` of the top ``m`` softmax probabilities.
* :class:`ReAct` (Sun et al., 2021): the energy of the logits of the features clipped at a percentile of
  the training features' activations.
* :func:`scale` (Xu et al., 2024, "Scaling for Training Time and Post-hoc Out-of-distribution
  Detection Enhancement"): every activation multiplied by ``exp(sum / sum of those at or above the
  row's own percentile)``; the energy of its logits.
* :func:`ash` (Djurisic et al., 2023, "Extremely Simple Activation Shaping"): activations below the
  row's own percentile set to zero, the rest kept (ASH-P), scaled as SCALE scales (ASH-S) or all set to
  the row's sum over their count (ASH-B); the energy of its logits.
* :class:`FDBD` (Liu & Qin, 2024, "Fast Decision Boundary based Out-of-Distribution Detector"): the
  feature's mean distance to the decision boundaries between its predicted class and each other class,
  over its distance to the training features' mean; negated.
"""

import numpy as np


def _float64(x):
    return np.asarray(x, np.float64)


def energy(logits, temperature=1.0):
    """``-T logsumexp(logits / T)``; at T = 1 contract.confidence.score, repeated here so this module needs only NumPy."""
    z = _float64(logits) / temperature
    top = z.max(axis=1)
    return -temperature * (top + np.log(np.exp(z - top[:, None]).sum(axis=1)))


def gen(logits, gamma=0.1, m=10):
    """GEN: ``sum p^gamma (1 - p)^gamma`` over the ``m`` largest softmax probabilities (0 for one certain class)."""
    z = _float64(logits)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    top = np.sort(p / p.sum(axis=1, keepdims=True), axis=1)[:, -m:]
    return (top ** gamma * (1.0 - top) ** gamma).sum(axis=1)


class ReAct:
    """The energy of ``min(features, c) @ w + b``, ``c`` the ``percentile`` of every training activation."""

    def __init__(self, features, w, b, percentile):
        self.clip = float(np.percentile(_float64(features), percentile))
        self.w, self.b = _float64(w), _float64(b)

    def __call__(self, features):
        return energy(np.minimum(_float64(features), self.clip) @ self.w + self.b)


def _pruned(features, percentile):
    """``(features, mask of each row's activations at or above its own percentile, row sums)``."""
    x = _float64(features)
    kept = x >= np.percentile(x, percentile, axis=1, keepdims=True)
    return x, kept, x.sum(axis=1, keepdims=True)


def scale(features, percentile):
    """SCALE's features: each row times ``exp(its sum / the sum of its activations at or above its percentile)``."""
    x, kept, total = _pruned(features, percentile)
    return x * np.exp(total / np.where(kept, x, 0.0).sum(axis=1, keepdims=True))


def ash(features, percentile, variant):
    """ASH's features: below each row's percentile zero; the rest kept (``"p"``), scaled as SCALE (``"s"``) or binarised (``"b"``)."""
    x, kept, total = _pruned(features, percentile)
    pruned = np.where(kept, x, 0.0)
    if variant == "p":
        return pruned
    if variant == "s":
        return pruned * np.exp(total / pruned.sum(axis=1, keepdims=True))
    if variant == "b":
        return kept * total / kept.sum(axis=1, keepdims=True)
    raise ValueError(f"ASH's variants are 'p', 's' and 'b', not {variant!r}")


class FDBD:
    """``-mean over c != k of (z_k - z_c) / |w_k - w_c|``, over ``|x - training mean|``; k the predicted class."""

    def __init__(self, features, w, b):
        self.mean = _float64(features).mean(axis=0)
        self.w, self.b = _float64(w), _float64(b)
        self.widths = np.linalg.norm(self.w[:, :, None] - self.w[:, None, :], axis=0)  # [C, C]: |w_k - w_c|

    def __call__(self, features):
        x = _float64(features)
        z = x @ self.w + self.b
        k = z.argmax(axis=1)
        widths = self.widths[k]
        distances = np.divide(z[np.arange(len(z)), k][:, None] - z, widths, out=np.zeros_like(z), where=widths > 0)
        return -distances.sum(axis=1) / (z.shape[1] - 1) / np.linalg.norm(x - self.mean, axis=1)


class Mahalanobis:
    """Squared distance to the nearest class mean under the classes' shared (within-class) covariance."""

    def __init__(self, features, labels, num_classes):
        features, labels = _float64(features), np.asarray(labels)
        missing = [c for c in range(num_classes) if not np.any(labels == c)]
        if missing:
            raise ValueError(f"no training features of classes {missing}: every class needs its mean")
        self.means = np.stack([features[labels == c].mean(axis=0) for c in range(num_classes)])
        centred = features - self.means[labels]
        self.precision = np.linalg.pinv(centred.T @ centred / len(features), hermitian=True)

    def __call__(self, features):
        x = _float64(features)
        # (x - m)' P (x - m) = x'Px - 2 x'Pm + m'Pm, for every class mean m at once.
        px = x @ self.precision
        quadratic = np.einsum("ij,ij->i", px, x)[:, None] - 2 * px @ self.means.T
        quadratic += np.einsum("cj,jk,ck->c", self.means, self.precision, self.means)[None, :]
        return quadratic.min(axis=1)


def normalised(features):
    """Each row divided by its L2 norm (a zero row stays zero)."""
    x = _float64(features)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def nearest_distances(bank, features, k, batch=512):
    """``[N, k]``: each normalised feature's distances to its ``k`` nearest normalised ``bank`` rows, nearest first."""
    bank = normalised(bank).astype(np.float32)  # float32: what a server would hold and multiply
    queries = normalised(features).astype(np.float32)
    out = np.empty((len(queries), k))
    for i in range(0, len(queries), batch):
        similarity = queries[i:i + batch] @ bank.T
        top = -np.sort(np.partition(-similarity, k - 1, axis=1)[:, :k], axis=1)  # most similar first
        # For unit vectors the squared distance is 2 - 2 cos: the nearest are the most similar.
        out[i:i + batch] = np.sqrt(np.maximum(2.0 - 2.0 * top.astype(np.float64), 0.0))
    return out


class KNN:
    """Distance from the normalised feature to its ``k``-th nearest normalised training feature (the bank)."""

    def __init__(self, bank, k):
        if not 1 <= k <= len(bank):
            raise ValueError(f"k must be from 1 to the bank's {len(bank)} features, not {k}")
        self.bank, self.k = bank, k

    def __call__(self, features):
        return nearest_distances(self.bank, features, self.k)[:, -1]


def affine_head(features, logits):
    """``(W, b, largest error)`` of the least-squares ``logits = features @ W + b``: the model's linear head, recovered.

    The head of every registered model is affine in its penultimate features (airbench's is
    ``Dense(use_bias=False)`` then ``Rescaling(1/9)``); the error says whether it was.
    """
    x, z = _float64(features), _float64(logits)
    design = np.concatenate([x, np.ones((len(x), 1))], axis=1)
    solution = np.linalg.lstsq(design, z, rcond=None)[0]
    w, b = solution[:-1], solution[-1]
    return w, b, float(np.max(np.abs(design @ solution - z)))


class ViM:
    """Virtual-logit matching: ``alpha * |residual| - logsumexp(logits)``, higher is more foreign.

    The origin is the point the head maps to zero logits, ``u = -b pinv(W)`` (zero for a head without
    bias); the principal subspace is the top ``dim`` eigenvectors of the training features'
    second moment about ``u``; the residual is the part of ``x - u`` outside it; ``alpha`` is the
    training features' mean largest logit over their mean residual norm.
    """

    def __init__(self, features, w, b, dim):
        x = _float64(features)
        w, b = _float64(w), _float64(b)
        if not 0 < dim < x.shape[1]:
            raise ValueError(f"the principal subspace needs from 1 to {x.shape[1] - 1} dimensions, not {dim}")
        self.w, self.b, self.dim = w, b, dim
        self.origin = -b @ np.linalg.pinv(w)
        centred = x - self.origin
        eigenvalues, eigenvectors = np.linalg.eigh(centred.T @ centred / len(x))
        self.null_space = eigenvectors[:, np.argsort(eigenvalues)[::-1][dim:]]
        self.alpha = float(np.mean((x @ w + b).max(axis=1)) / np.mean(self.residual(x)))

    def residual(self, features):
        return np.linalg.norm((_float64(features) - self.origin) @ self.null_space, axis=1)

    def __call__(self, features):
        x = _float64(features)
        return self.alpha * self.residual(x) + energy(x @ self.w + self.b)


class Fusion:
    """The sum of scores, each standardised by its mean and standard deviation on reference (held-out)
    scores and multiplied by its weight (default: 1 each)."""

    def __init__(self, reference_scores, weights=None):
        self.stats = [(float(np.mean(s)), float(np.std(s)) or 1.0) for s in map(_float64, reference_scores)]
        self.weights = [1.0] * len(self.stats) if weights is None else [float(w) for w in weights]
        if len(self.weights) != len(self.stats):
            raise ValueError(f"{len(self.stats)} scores, {len(self.weights)} weights")

    def __call__(self, scores):
        if len(scores) != len(self.stats):
            raise ValueError(f"{len(self.stats)} scores were fitted, {len(scores)} given")
        return sum(w * (_float64(s) - mean) / std for s, (mean, std), w in zip(scores, self.stats, self.weights))
