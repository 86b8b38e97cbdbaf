"""Where a training step of airbench94's own PyTorch code goes on this CPU: the control for
``bench/airbench_step_profile.py``, timed the same way.

Needs PyTorch (the environment of ``bench/airbench94_reference.py``, whose network, loader and
optimizer it imports unchanged)::

    python bench/airbench94_step_profile.py --threads 2 [--json out.json]

Timed, each the median of ``--repeats`` after ``--warmup`` untimed, on ``--images`` random 32x32
images at batch 1024:

* ``loop_step``: an epoch of airbench94's training loop as it is (its loader's translations and
  flips, forward, backward, the optimizer, the rate schedule, lookahead every 5 steps), per step;
* ``train_step``: forward, backward and the optimizer on one batch already in memory;
* ``forward_backward``: the loss and its gradients, no update;
* ``forward``: the network in training mode, no gradients;
* ``optimizer``: ``optimizer.step()`` on gradients already there;
* ``input``: the loader alone, per batch (the epoch's translation of every image shared out).

It also records ``torch.profiler`` over ``--trace-steps`` train steps and sums the ops' own time by kind.
"""

import argparse
import os
import platform
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import airbench94_reference as reference  # noqa: E402
from airbench_step_profile import median_seconds, summarise  # noqa: E402  (the port's; stdlib only at import)
from emit import emit  # noqa: E402

KINDS = (  # (kind, substrings of aten op names), first match wins
    ("convolution backward", ("convolution_backward",)),
    ("convolution forward", ("convolution", "conv2d")),
    ("batchnorm", ("batch_norm",)),
    ("gelu", ("gelu",)),
    ("pooling", ("max_pool",)),
    ("optimizer updates", ("_foreach", "lerp", "sgd")),
    ("matmul (logits)", ("mm", "linear")),
)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=10240, help="random training images (10 steps an epoch)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--trace-steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    hyp = reference.hyp
    batch = hyp["opt"]["batch_size"]
    images = torch.randint(0, 256, (args.images, 32, 32, 3), dtype=torch.uint8)
    labels = torch.randint(0, 10, (args.images,))
    loader = reference.CifarLoader(images, labels, train=True, batch_size=batch, aug=hyp["aug"])
    steps_per_epoch = len(loader)
    total_steps = 10 * steps_per_epoch

    model = reference.make_net()
    reference.init_whitening_conv(model[0], reference.normalize(loader.images[:5000]))
    optimizer, scheduler = reference.make_optimizer(model, total_steps)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=hyp["opt"]["label_smoothing"], reduction="none")
    lookahead = reference.LookaheadState(model)
    alpha = 0.95**5 * (torch.arange(total_steps + 1) / total_steps) ** 3
    state = {"step": 0}
    model.train()

    def step(inputs, targets):
        outputs = model(inputs)
        loss = loss_fn(outputs, targets).sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def loop_epoch():  # airbench94's train() loop body, as it is
        for inputs, targets in loader:
            step(inputs, targets)
            scheduler.step()
            state["step"] += 1
            if state["step"] % 5 == 0:
                lookahead.update(model, decay=alpha[min(state["step"], total_steps)].item())

    def forward_backward(inputs, targets):
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(inputs), targets).sum().backward()

    def forward(inputs):
        with torch.no_grad():
            model(inputs)

    x, y = next(iter(loader))
    batches = iter(())

    def next_batch():
        nonlocal batches
        try:
            return next(batches)
        except StopIteration:
            batches = iter(loader)
            return next(batches)

    seconds = {"loop_step": median_seconds(loop_epoch, args.repeats, 1) / steps_per_epoch,
               "train_step": median_seconds(lambda: step(x, y), args.repeats, args.warmup),
               "forward_backward": median_seconds(lambda: forward_backward(x, y), args.repeats, args.warmup),
               "forward": median_seconds(lambda: forward(x), args.repeats, args.warmup)}
    forward_backward(x, y)
    seconds["optimizer"] = median_seconds(optimizer.step, args.repeats, args.warmup)
    seconds["input"] = median_seconds(next_batch, args.repeats * 4, args.warmup)
    report = {"torch": torch.__version__, "threads": torch.get_num_threads(), "python": platform.python_version(),
              "cpu_count": os.cpu_count(), "batch": batch, "steps_per_epoch": steps_per_epoch,
              "repeats": args.repeats, "seconds": {name: round(value, 3) for name, value in seconds.items()}}

    if args.trace_steps:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            for _ in range(args.trace_steps):
                step(x, y)
        types = {event.key: event.self_cpu_time_total / 1e6 for event in profile.key_averages()}
        report["op_seconds_per_step"], report["top_op_types"] = summarise(types, args.trace_steps, KINDS)
    emit(report, args.json)


if __name__ == "__main__":
    main()
