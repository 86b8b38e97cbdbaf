"""The one rule for ranking classes: most probable first, a tie going to the lower class id.

The server's JSON API and page (``serve/classify.py``), the v2 classification extension
(``serve/v2_response.py``) and the client (``client/transports/``) all rank with :func:`top_k`.
"""

import numpy as np


def top_k(probabilities, k):
    """``(class ids, probabilities)`` of the ``k`` best classes of each row, best first.

    ``probabilities`` is ``[C]`` or ``[N, C]``; the results have its leading shape and ``min(k, C)``
    columns. A stable sort of the negated values keeps equal probabilities in class-id order.
    """
    probabilities = np.asarray(probabilities)
    k = min(int(k), probabilities.shape[-1])
    order = np.argsort(-probabilities, axis=-1, kind="stable")[..., :k]
    return order, np.take_along_axis(probabilities, order, axis=-1)
