"""airbench94's own PyTorch training script, run on the CPU against CIFAR-10 from a JPEG zip.

A control for ``python -m train --model airbench``: the same recipe in its authors' code on the
same data, so that a gap between this project's accuracy and airbench94's published 94.01% can be
put down to the data or to the port. Needs PyTorch, which the project does not install
(``pip install torch numpy pillow`` in a separate environment)::

    python bench/training/airbench94_reference.py --data ../shared/data/cifar10-jpeg.zip

The training code is legacy/airbench94.py from https://github.com/KellerJordan/cifar10-airbench
(MIT licence, notice below), with these changes only: float32 on the CPU instead of float16 on
CUDA; the images come from a zip of class folders of JPEGs (``train/<class>/*.jpg``,
``test/<class>/*.jpg``, classes in alphabetical order) instead of torchvision's download; wall
clock instead of CUDA events; one run, with the test evaluation after each epoch optional.

Copyright (c) 2024 Keller Jordan

Permission is hereby granted, free of charge, to any person obtaining a copy of this software and
associated documentation files (the "Software"), to deal in the Software without restriction,
including without limitation the rights to use, copy, modify, merge, publish, distribute,
sublicense, and/or sell copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions: The above copyright notice and this
permission notice shall be included in all copies or substantial portions of the Software.
THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT
NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM,
DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT
OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
"""

import argparse
import io
import json
import os
import time
import zipfile
from math import ceil

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

hyp = {
    "opt": {
        "train_epochs": 9.9,
        "batch_size": 1024,
        "lr": 11.5,  # learning rate per 1024 examples
        "momentum": 0.85,
        "weight_decay": 0.0153,  # weight decay per 1024 examples (decoupled from learning rate)
        "bias_scaler": 64.0,  # scales up learning rate (but not weight decay) for BatchNorm biases
        "label_smoothing": 0.2,
        "whiten_bias_epochs": 3,  # how many epochs to train the whitening layer bias before freezing
    },
    "aug": {"flip": True, "translate": 2},
    "net": {
        "widths": {"block1": 64, "block2": 256, "block3": 256},
        "batchnorm_momentum": 0.6,
        "scaling_factor": 1 / 9,
        "tta_level": 2,  # the level of test-time augmentation: 0=none, 1=mirror, 2=mirror+translate
    },
}

CIFAR_MEAN = torch.tensor((0.4914, 0.4822, 0.4465))
CIFAR_STD = torch.tensor((0.2470, 0.2435, 0.2616))


def load_split(archive, split):
    """(images uint8 NHWC, labels int64, classes, file names) for one split of a zip of class folders of JPEGs or PNGs."""
    names = sorted(n for n in archive.namelist() if n.startswith(f"{split}/") and n.endswith((".jpg", ".png")))
    classes = sorted({n.split("/")[1] for n in names})
    images = np.stack([np.asarray(Image.open(io.BytesIO(archive.read(n))).convert("RGB")) for n in names])
    labels = np.array([classes.index(n.split("/")[1]) for n in names])
    return torch.from_numpy(images), torch.from_numpy(labels), classes, names


def normalize(images):
    return (images - CIFAR_MEAN.view(1, 3, 1, 1)) / CIFAR_STD.view(1, 3, 1, 1)


def batch_flip_lr(inputs):
    flip_mask = (torch.rand(len(inputs)) < 0.5).view(-1, 1, 1, 1)
    return torch.where(flip_mask, inputs.flip(-1), inputs)


def batch_crop(images, crop_size):
    r = (images.size(-1) - crop_size) // 2
    shifts = torch.randint(-r, r + 1, size=(len(images), 2))
    images_out = torch.empty((len(images), 3, crop_size, crop_size), dtype=images.dtype)
    for sy in range(-r, r + 1):
        for sx in range(-r, r + 1):
            mask = (shifts[:, 0] == sy) & (shifts[:, 1] == sx)
            images_out[mask] = images[mask, :, r + sy:r + sy + crop_size, r + sx:r + sx + crop_size]
    return images_out


class CifarLoader:
    def __init__(self, images, labels, train=True, batch_size=500, aug=None):
        self.images = (images.float() / 255).permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
        self.labels = labels
        self.proc_images = {}
        self.epoch = 0
        self.aug = aug or {}
        self.batch_size = batch_size
        self.drop_last = train
        self.shuffle = train

    def __len__(self):
        return len(self.images) // self.batch_size if self.drop_last else ceil(len(self.images) / self.batch_size)

    def __iter__(self):
        if self.epoch == 0:
            images = self.proc_images["norm"] = normalize(self.images)
            if self.aug.get("flip", False):  # pre-flip, for the every-other-epoch flipping
                images = self.proc_images["flip"] = batch_flip_lr(images)
            pad = self.aug.get("translate", 0)
            if pad > 0:
                self.proc_images["pad"] = F.pad(images, (pad,) * 4, "reflect")
        if self.aug.get("translate", 0) > 0:
            images = batch_crop(self.proc_images["pad"], self.images.shape[-2])
        elif self.aug.get("flip", False):
            images = self.proc_images["flip"]
        else:
            images = self.proc_images["norm"]
        if self.aug.get("flip", False) and self.epoch % 2 == 1:
            images = images.flip(-1)
        self.epoch += 1
        indices = (torch.randperm if self.shuffle else torch.arange)(len(images))
        for i in range(len(self)):
            idxs = indices[i * self.batch_size:(i + 1) * self.batch_size]
            yield images[idxs], self.labels[idxs]


class Flatten(nn.Module):
    def forward(self, x):
        return x.reshape(x.size(0), -1)


class Mul(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return x * self.scale


class BatchNorm(nn.BatchNorm2d):
    def __init__(self, num_features, momentum, eps=1e-12, weight=False, bias=True):
        super().__init__(num_features, eps=eps, momentum=1 - momentum)
        self.weight.requires_grad = weight
        self.bias.requires_grad = bias


class Conv(nn.Conv2d):
    def __init__(self, in_channels, out_channels, kernel_size=3, padding="same", bias=False):
        super().__init__(in_channels, out_channels, kernel_size=kernel_size, padding=padding, bias=bias)

    def reset_parameters(self):
        super().reset_parameters()
        if self.bias is not None:
            self.bias.data.zero_()
        w = self.weight.data
        torch.nn.init.dirac_(w[:w.size(1)])


class ConvGroup(nn.Module):
    def __init__(self, channels_in, channels_out, batchnorm_momentum):
        super().__init__()
        self.conv1 = Conv(channels_in, channels_out)
        self.pool = nn.MaxPool2d(2)
        self.norm1 = BatchNorm(channels_out, batchnorm_momentum)
        self.conv2 = Conv(channels_out, channels_out)
        self.norm2 = BatchNorm(channels_out, batchnorm_momentum)
        self.activ = nn.GELU()

    def forward(self, x):
        x = self.activ(self.norm1(self.pool(self.conv1(x))))
        return self.activ(self.norm2(self.conv2(x)))


def make_net():
    widths = hyp["net"]["widths"]
    batchnorm_momentum = hyp["net"]["batchnorm_momentum"]
    whiten_kernel_size = 2
    whiten_width = 2 * 3 * whiten_kernel_size**2
    net = nn.Sequential(
        Conv(3, whiten_width, whiten_kernel_size, padding=0, bias=True),
        nn.GELU(),
        ConvGroup(whiten_width, widths["block1"], batchnorm_momentum),
        ConvGroup(widths["block1"], widths["block2"], batchnorm_momentum),
        ConvGroup(widths["block2"], widths["block3"], batchnorm_momentum),
        nn.MaxPool2d(3),
        Flatten(),
        nn.Linear(widths["block3"], 10, bias=False),
        Mul(hyp["net"]["scaling_factor"]),
    )
    net[0].weight.requires_grad = False
    return net.to(memory_format=torch.channels_last)


def get_patches(x, patch_shape):
    c, (h, w) = x.shape[1], patch_shape
    return x.unfold(2, h, 1).unfold(3, w, 1).transpose(1, 3).reshape(-1, c, h, w).float()


def get_whitening_parameters(patches):
    n, c, h, w = patches.shape
    patches_flat = patches.view(n, -1)
    est_patch_covariance = (patches_flat.T @ patches_flat) / n
    eigenvalues, eigenvectors = torch.linalg.eigh(est_patch_covariance, UPLO="U")
    return eigenvalues.flip(0).view(-1, 1, 1, 1), eigenvectors.T.reshape(c * h * w, c, h, w).flip(0)


def init_whitening_conv(layer, train_set, eps=5e-4):
    patches = get_patches(train_set, patch_shape=layer.weight.data.shape[2:])
    eigenvalues, eigenvectors = get_whitening_parameters(patches)
    eigenvectors_scaled = eigenvectors / torch.sqrt(eigenvalues + eps)
    layer.weight.data[:] = torch.cat((eigenvectors_scaled, -eigenvectors_scaled))


class LookaheadState:
    def __init__(self, net):
        self.net_ema = {k: v.clone() for k, v in net.state_dict().items()}

    def update(self, net, decay):
        for ema_param, net_param in zip(self.net_ema.values(), net.state_dict().values()):
            if net_param.dtype in (torch.half, torch.float):
                ema_param.lerp_(net_param, 1 - decay)
                net_param.copy_(ema_param)


def infer(model, loader, tta_level=0):
    def infer_basic(inputs, net):
        return net(inputs).clone()

    def infer_mirror(inputs, net):
        return 0.5 * net(inputs) + 0.5 * net(inputs.flip(-1))

    def infer_mirror_translate(inputs, net):
        logits = infer_mirror(inputs, net)
        padded_inputs = F.pad(inputs, (1,) * 4, "reflect")
        inputs_translate_list = [padded_inputs[:, :, 0:32, 0:32], padded_inputs[:, :, 2:34, 2:34]]
        logits_translate = torch.stack([infer_mirror(t, net) for t in inputs_translate_list]).mean(0)
        return 0.5 * logits + 0.5 * logits_translate

    model.eval()
    test_images = normalize(loader.images)
    infer_fn = [infer_basic, infer_mirror, infer_mirror_translate][tta_level]
    with torch.no_grad():
        return torch.cat([infer_fn(inputs, model) for inputs in test_images.split(2000)])


def evaluate(model, loader, tta_level=0):
    logits = infer(model, loader, tta_level)
    return (logits.argmax(1) == loader.labels).float().mean().item()


def make_optimizer(model, total_train_steps):
    """airbench94's Nesterov SGD (BatchNorm biases 64x faster) and its triangular rate, as its main() makes them."""
    batch_size = hyp["opt"]["batch_size"]
    momentum = hyp["opt"]["momentum"]
    kilostep_scale = 1024 * (1 + 1 / (1 - momentum))
    lr = hyp["opt"]["lr"] / kilostep_scale  # un-decoupled learning rate for PyTorch SGD
    wd = hyp["opt"]["weight_decay"] * batch_size / kilostep_scale
    lr_biases = lr * hyp["opt"]["bias_scaler"]

    norm_biases = [p for k, p in model.named_parameters() if "norm" in k and p.requires_grad]
    other_params = [p for k, p in model.named_parameters() if "norm" not in k and p.requires_grad]
    param_configs = [dict(params=norm_biases, lr=lr_biases, weight_decay=wd / lr_biases),
                     dict(params=other_params, lr=lr, weight_decay=wd / lr)]
    optimizer = torch.optim.SGD(param_configs, momentum=momentum, nesterov=True)

    def get_lr(step):
        warmup_steps = int(total_train_steps * 0.23)
        warmdown_steps = total_train_steps - warmup_steps
        if step < warmup_steps:
            frac = step / warmup_steps
            return 0.2 * (1 - frac) + 1.0 * frac
        frac = (step - warmup_steps) / warmdown_steps
        return 1.0 * (1 - frac) + 0.07 * frac

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, get_lr)


def train(train_loader, test_loader, val_each_epoch=False):
    batch_size = hyp["opt"]["batch_size"]
    epochs = hyp["opt"]["train_epochs"]
    loss_fn = nn.CrossEntropyLoss(label_smoothing=hyp["opt"]["label_smoothing"], reduction="none")
    total_train_steps = ceil(len(train_loader) * epochs)

    model = make_net()
    current_steps = 0
    optimizer, scheduler = make_optimizer(model, total_train_steps)
    alpha_schedule = 0.95**5 * (torch.arange(total_train_steps + 1) / total_train_steps) ** 3
    lookahead_state = LookaheadState(model)

    start = time.perf_counter()
    init_whitening_conv(model[0], normalize(train_loader.images[:5000]))

    for epoch in range(ceil(epochs)):
        model[0].bias.requires_grad = epoch < hyp["opt"]["whiten_bias_epochs"]
        model.train()
        for inputs, labels in train_loader:
            outputs = model(inputs)
            loss = loss_fn(outputs, labels).sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            current_steps += 1
            if current_steps % 5 == 0:
                lookahead_state.update(model, decay=alpha_schedule[current_steps].item())
            if current_steps >= total_train_steps:
                lookahead_state.update(model, decay=1.0)
                break
        train_acc = (outputs.detach().argmax(1) == labels).float().mean().item()
        line = {"epoch": epoch + 1, "train_loss": loss.item() / batch_size, "train_acc": train_acc,
                "elapsed_s": round(time.perf_counter() - start, 1)}
        if val_each_epoch:
            line["val_acc"] = evaluate(model, test_loader, tta_level=0)
        print(json.dumps(line), flush=True)

    train_seconds = time.perf_counter() - start
    val_acc = evaluate(model, test_loader, tta_level=0)
    predicted = infer(model, test_loader, hyp["net"]["tta_level"]).argmax(1)
    tta_val_acc = (predicted == test_loader.labels).float().mean().item()
    return {"val_acc": val_acc, "tta_val_acc": tta_val_acc, "steps": current_steps,
            "train_seconds": round(train_seconds, 1), "total_seconds": round(time.perf_counter() - start, 1),
            "predicted": predicted.tolist()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="zip of train/<class>/*.jpg|png and test/<class>/*.jpg|png")
    parser.add_argument("--predictions", help="write each run's class for every test file to this JSON "
                        "(python -m bench.accuracy.of_record compares it with an exported model on the same images)")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--val-each-epoch", action="store_true", help="also evaluate one view after each epoch")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    with zipfile.ZipFile(args.data) as archive:
        train_images, train_labels, classes, _ = load_split(archive, "train")
        test_images, test_labels, _, test_names = load_split(archive, "test")
    print(json.dumps({"train": len(train_labels), "test": len(test_labels), "classes": classes,
                      "torch": torch.__version__, "threads": torch.get_num_threads()}), flush=True)
    train_loader = CifarLoader(train_images, train_labels, train=True, batch_size=hyp["opt"]["batch_size"],
                               aug=hyp["aug"])
    test_loader = CifarLoader(test_images, test_labels, train=False, batch_size=2000)
    results = []
    for run in range(args.runs):
        train_loader.epoch = 0
        results.append(train(train_loader, test_loader, args.val_each_epoch))
        print(json.dumps({"run": run, **{k: v for k, v in results[-1].items() if k != "predicted"}}), flush=True)
        if args.predictions:  # rewritten after every run, so a run that finished is never lost
            with open(args.predictions, "w") as f:
                json.dump({"data": os.path.basename(args.data), "seed": args.seed, "classes": classes, "runs": [
                    {"tta_val_acc": r["tta_val_acc"], "train_seconds": r["train_seconds"],
                     "predicted": dict(zip(test_names, (classes[c] for c in r["predicted"])))} for r in results]}, f)
    accs = np.array([r["tta_val_acc"] for r in results])
    print(json.dumps({"runs": len(accs), "tta_val_acc_mean": float(accs.mean()),
                      "tta_val_acc_std": float(accs.std(ddof=1)) if len(accs) > 1 else None}), flush=True)


if __name__ == "__main__":
    main()
