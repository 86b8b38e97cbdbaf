"""A few of airbench94's own training steps, written down for bench/airbench_port_check.py.

Runs the code in bench/airbench94_reference.py (so it needs PyTorch too)::

    python bench/airbench94_trace.py --data ../shared/data/cifar10-jpeg.zip --out /tmp/trace.npz
"""

import argparse
import types
import zipfile

import numpy as np
import torch
from torch import nn

import airbench94_reference as reference  # beside this file, which Python puts first on the path


def trace(images, labels, steps, batch_size, seed, path):
    """Write ``path`` (.npz): airbench94's state before and after ``steps`` plain SGD steps.

    The steps are airbench94's own (optimizer, rate, loss, whitening), on fixed batches with no
    augmentation and no lookahead, at ``batch_size`` with the rate and decay it implies, and
    with the port's normalisation constants, so that the port can repeat them exactly. They are
    taken twice from the same start, in float32 and in float64: how far those two end apart is
    how far float rounding alone carries these steps (the noise floor for the port's result).
    Also written: the images (the first 5,000 whiten, the first ``steps * batch_size`` train,
    500 more are evaluated) and the float32 network's six-view logits on those 500.
    """
    hyp = reference.hyp
    hyp["opt"]["batch_size"] = batch_size
    torch.manual_seed(seed)
    order = torch.randperm(len(images))
    held = max(5000, steps * batch_size)
    images, labels = images[order[:held + 500]], labels[order[:held + 500]]
    state = {}
    for dtype in (torch.float32, torch.float64):
        # train.models.CIFAR10_MEAN and CIFAR10_STD; reference.normalize reads these.
        reference.CIFAR_MEAN = torch.tensor((125.3, 123.0, 113.9), dtype=dtype) / 255
        reference.CIFAR_STD = torch.tensor((63.0, 62.1, 66.7), dtype=dtype) / 255
        x = reference.normalize((images.to(dtype) / 255).permute(0, 3, 1, 2).contiguous())
        model = reference.make_net()
        if dtype == torch.float32:
            reference.init_whitening_conv(model[0], x[:5000])
            state["initial"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            model = model.double()
            model.load_state_dict(state["initial"])
        optimizer, scheduler = reference.make_optimizer(model, steps)
        loss_fn = nn.CrossEntropyLoss(label_smoothing=hyp["opt"]["label_smoothing"], reduction="none")
        model.train()
        for step in range(steps):
            batch = slice(step * batch_size, (step + 1) * batch_size)
            loss = loss_fn(model(x[batch]), labels[batch]).sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
        state["final" if dtype == torch.float32 else "final64"] = model.state_dict()
        if dtype == torch.float32:
            evaluated = types.SimpleNamespace(images=(images[held:].float() / 255).permute(0, 3, 1, 2).contiguous())
            logits = reference.infer(model, evaluated, tta_level=hyp["net"]["tta_level"]).numpy()
    arrays = {f"{when}/{k}": v.detach().numpy().astype(np.float32) if v.is_floating_point() else v.numpy()
              for when, weights in state.items() for k, v in weights.items()}
    np.savez(path, images=images.numpy(), labels=labels.numpy(), steps=steps, batch_size=batch_size, held=held,
             logits=logits, **arrays)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="zip of train/<class>/*.jpg (the test split is not read)")
    parser.add_argument("--out", required=True, metavar="NPZ", help="where to write the trace")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with zipfile.ZipFile(args.data) as archive:
        images, labels, _, _ = reference.load_split(archive, "train")
    trace(images, labels, args.steps, args.batch, args.seed, args.out)


if __name__ == "__main__":
    main()
