"""Is the "none of these" verdict as right for JPEG uploads as for the original pixels, and would fitting
its threshold on JPEG copies of the held-out slice too make it so?

Typical usage::

    python -m bench.research.ood_uploads --run runs/airbench_muon --data ../shared/data/cifar10-png.zip \\
        --json bench/records/ood-uploads-airbench_muon-s0.json

The zip's test images (in-class) and bench/confidence/ood_sets.py's photos (foreign) are sent as a user
would: saved at a size (bicubic) as PNG or as JPEG at a quality, then decoded and resized to 32x32 as the
server does (``contract.pixels.to_rgb32``). For each upload form: the accuracy, the share of test images
and of photos flagged, and the photos AUROC of the served energy, at two thresholds:

* ``served``: 98% of the held-out slice's original pixels pass (what export fits);
* ``with_jpeg``: 98% of the held-out slice pass, as original pixels and as 32x32 JPEGs at quality 75;

and at each of ``--pass-rates`` (``pass R``: that share of the held-out slice's original pixels pass), to
show what a lower false-alarm rate on every upload form would cost in foreign photos caught.
"""

import argparse
import io
import sys

import numpy as np

from bench import record
from bench.accuracy.of_record import test_split, wilson
from bench.confidence import ood, ood_sets
from contract import confidence as rules

#: (side in pixels, JPEG quality or None for PNG) of each upload form.
FORMS = ((32, None), (32, 90), (32, 75), (256, None), (256, 90), (256, 75))


def upload(images, side, quality):
    """``images`` as the server reads them after each was saved at ``side`` pixels as PNG or JPEG ``quality``."""
    from PIL import Image

    from contract.pixels import to_rgb32

    out = []
    for pixels in images:
        picture = Image.fromarray(pixels)
        if side != picture.width:
            picture = picture.resize((side, side), Image.Resampling.BICUBIC)
        encoded = io.BytesIO()
        picture.save(encoded, "PNG") if quality is None else picture.save(encoded, "JPEG", quality=quality)
        out.append(to_rgb32(Image.open(io.BytesIO(encoded.getvalue()))))
    return np.stack(out)


def main(argv=None):
    from sklearn.metrics import roc_auc_score

    from export import read_images

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="a finished training run with a held-out slice")
    parser.add_argument("--data", required=True, help="zip whose test/<class>/* images are the in-class uploads")
    parser.add_argument("--json", help="write the record here")
    parser.add_argument("--pass-rates", type=lambda text: [float(r) for r in text.split(",")], default=[],
                        help="more thresholds, each letting that share of the held-out slice pass, e.g. 0.985,0.99")
    args = parser.parse_args(argv)
    manifest, logits = ood.run_logits(args.run)
    if manifest.holdout is None:
        parser.error(f"{args.run} kept no held-out slice (python -m train --holdout N)")
    held_out, _ = read_images(args.run, manifest.holdout)
    _, images, labels, _ = test_split(args.data)
    photos = ood_sets.make()["photos"]
    held_scores = rules.score(logits(held_out))
    thresholds = {"served": rules.threshold_for(held_scores),
                  "with_jpeg": rules.threshold_for(np.concatenate(
                      [held_scores, rules.score(logits(upload(held_out, 32, 75)))])),
                  **{f"pass {rate:g}": rules.threshold_for(held_scores, rate) for rate in args.pass_rates}}
    forms = {}
    for side, quality in FORMS:
        z = logits(upload(images, side, quality))
        inside, outside = rules.score(z), rules.score(logits(upload(photos, side, quality)))
        name = f"{side} px, " + ("PNG" if quality is None else f"JPEG quality {quality}")
        forms[name] = {
            "accuracy": float(np.mean(z.argmax(axis=1) == labels)),
            "photos_auroc": float(roc_auc_score(np.r_[np.zeros(len(inside)), np.ones(len(outside))],
                                                np.r_[inside, outside])),
            **{fit: {"test_flagged": float(np.mean(inside > t)),
                     "test_flagged_interval_95": list(wilson(int(np.sum(inside > t)), len(inside))),
                     "photos_flagged": float(np.mean(outside > t))} for fit, t in thresholds.items()}}
        print(name, {k: (round(v, 4) if isinstance(v, float) else {a: round(b, 4) for a, b in v.items()
                                                                      if not isinstance(b, list)})
                     for k, v in forms[name].items()}, flush=True)
    result = {"run": args.run, "model": manifest.model.name, "test_images": int(len(labels)),
              "photos": int(len(photos)), "thresholds": thresholds, "forms": forms}
    if args.json:
        record.write(args.json, result, __spec__.name, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
