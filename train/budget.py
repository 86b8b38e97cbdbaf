"""A training time budget: the most epochs of a recipe that fit in the seconds a user gives.

Typical usage (``python -m train --time-budget 480``, or ``TIME_BUDGET`` in ``scripts/main.sh``)::

    timer = budget.Timer(480, started=clock(), steps_per_epoch=45, max_epochs=10, handover_steps=8)
    timer.began_training(clock())
    after each step:  choice = timer.step_ended(clock(), steps_taken)   # a contract.manifest.Budget, once

The run starts with the schedule at the recipe's length. The first step compiles, and is timed
apart; the next :data:`TIMED_STEPS` are timed, and their median is the step's time. The choice is
then the most epochs, at least one and at most the recipe's, whose predicted end is inside the
budget: the clock so far, the steps left at the measured time, and what follows the last step
(:func:`handover_steps`: rebuilding the model, evaluating the test images through the test-time
views, writing the files). The schedule's length is set to the chosen epochs' steps
(train.schedules.length), so the learning rate still ends at its end, and the few steps already
taken moved along the longer schedule by at most :data:`TIMED_STEPS` + 1 of its steps.

The choice is made once. It is written into the run directory (:data:`CHOICE_FILE`) when made, and a
run resumed after a kill takes it from there rather than choosing again: the schedule its backup
was trained on stays the schedule. Pure Python: the clock is passed in, so tests drive it.
"""

import dataclasses
import json
import math
import os
import statistics

from contract import manifest as manifests
from contract import replaced_atomically

#: Steps timed after the first (compiling) one before the choice. Five steps of airbench_muon are
#: about 10 s on an AVX-512 BF16 + AMX host, 4% of a seven-epoch run.
TIMED_STEPS = 5
#: What follows the last step, in training images' time per test image: the handover rebuilds the
#: model, evaluates every test image (airbench's through six test-time views), writes the samples and
#: the manifest. Its work is test images, not steps: about 6 s after airbench_muon's last step on the
#: AVX-512 BF16 + AMX kind for 1,000 test images, the time of 6 steps of 1,000 images or 3 of 2,000.
HANDOVER_IMAGES_PER_TEST_IMAGE = 8


def handover_steps(global_batch, test_images):
    """What the handover after the last step costs, in steps of ``global_batch`` (:data:`HANDOVER_IMAGES_PER_TEST_IMAGE`)."""
    return HANDOVER_IMAGES_PER_TEST_IMAGE * test_images / global_batch
#: In the run directory: the choice, kept for a resumed run (contract.manifest.Budget as JSON).
CHOICE_FILE = "budget.json"


def predicted_seconds(epochs, elapsed_s, steps_done, step_s, steps_per_epoch, reserve_s):
    """The whole run's predicted wall time at ``epochs``: the clock so far, the steps left, and the reserve."""
    return elapsed_s + max(0, epochs * steps_per_epoch - steps_done) * step_s + reserve_s


def choose(budget_s, elapsed_s, steps_done, step_s, steps_per_epoch, max_epochs, reserve_s):
    """``(epochs, predicted seconds)``: the most epochs up to ``max_epochs`` predicted to end inside ``budget_s``.

    When not even the epoch under way fits, that epoch: training cannot stop at a step before its
    epoch ends (the backup, the history and the schedule all count whole epochs).
    """
    under_way = max(1, math.ceil(steps_done / steps_per_epoch))
    epochs = under_way
    for candidate in range(under_way, max_epochs + 1):
        if predicted_seconds(candidate, elapsed_s, steps_done, step_s, steps_per_epoch, reserve_s) <= budget_s:
            epochs = candidate
    return epochs, predicted_seconds(epochs, elapsed_s, steps_done, step_s, steps_per_epoch, reserve_s)


class Timer:
    """Times a run's steps on a clock it is given, and chooses the run's length once it has timed enough.

    ``started``: the clock when the run began (the budget counts from there); ``handover_steps``: what
    follows the last step, in steps (:func:`handover_steps`).
    """

    def __init__(self, budget_s, started, steps_per_epoch, max_epochs, handover_steps, timed_steps=TIMED_STEPS):
        if not budget_s > 0:
            raise ValueError(f"a time budget must be more than 0 seconds, got {budget_s}")
        self.budget_s, self.started = float(budget_s), started
        self.steps_per_epoch, self.max_epochs = steps_per_epoch, max_epochs
        self.timed_steps, self.handover_steps = timed_steps, handover_steps
        self.ends = []  # (clock, steps taken in the run) at each step's end in this process
        self.began = None
        self.choice = None

    def began_training(self, now):
        """The clock when this process's first step begins: that step, which compiles, ends ``compile + step`` later."""
        self.began = now

    def step_ended(self, now, step):
        """Note that the run has taken ``step`` steps at ``now`` (several a call with --steps-per-execution).

        Returns the :class:`contract.manifest.Budget` chosen when this call made the choice, else None.
        """
        self.ends.append((now, step))
        if self.choice is not None:
            return None
        if step - self.ends[0][1] < self.timed_steps and step < self.max_epochs * self.steps_per_epoch:
            return None
        self.choice = self._choose(now, step)
        return self.choice

    def _choose(self, now, step):
        # After the first call, which compiles: each call's time over the steps it took.
        per_step = [(t1 - t0) / (s1 - s0) for (t0, s0), (t1, s1) in zip(self.ends, self.ends[1:]) if s1 > s0]
        first_call = self.ends[0][0] - (self.began if self.began is not None else self.ends[0][0])
        first_steps = self.ends[1][1] - self.ends[0][1] if len(self.ends) > 1 else 1
        # With nothing timed after the first call, its time, compile included: on the safe side.
        step_s = statistics.median(per_step) if per_step else first_call / first_steps
        reserve_s = self.handover_steps * step_s
        elapsed_s = now - self.started
        epochs, predicted_s = choose(self.budget_s, elapsed_s, step, step_s, self.steps_per_epoch, self.max_epochs,
                                     reserve_s)
        return manifests.Budget(
            seconds=self.budget_s, epochs=epochs, max_epochs=self.max_epochs, steps_per_epoch=self.steps_per_epoch,
            step_s=round(step_s, 4), timed_steps=step - self.ends[0][1],
            compile_s=round(max(0.0, first_call - first_steps * step_s), 2), elapsed_s=round(elapsed_s, 2),
            steps_done=step, reserve_s=round(reserve_s, 2), predicted_s=round(predicted_s, 1))


def describe(choice):
    """The one line that says what the budget chose and why."""
    steps = choice.epochs * choice.steps_per_epoch
    line = (f"time budget {choice.seconds:.0f} s: {choice.epochs} of the recipe's {choice.max_epochs} epochs "
            f"({steps} steps); a step takes {choice.step_s:.2f} s (median of {choice.timed_steps} timed after the "
            f"first, which took {choice.compile_s:.1f} s more to compile), {choice.elapsed_s:.0f} s gone, "
            f"predicted {choice.predicted_s:.0f} s in all with {choice.reserve_s:.0f} s for the evaluation after "
            f"the last step")
    if choice.epochs < choice.max_epochs:
        more = predicted_seconds(choice.epochs + 1, choice.elapsed_s, choice.steps_done, choice.step_s,
                                 choice.steps_per_epoch, choice.reserve_s)
        line += f"; {choice.epochs + 1} epochs would take {more:.0f} s"
    if choice.predicted_s > choice.seconds:
        line += f"; OVER THE BUDGET: even one epoch takes longer here"
    return line


def write_choice(run_dir, choice):
    """Keep ``choice`` in the run directory, atomically, for a resumed run."""
    with replaced_atomically(os.path.join(run_dir, CHOICE_FILE), ".json") as tmp, open(tmp, "w") as f:
        json.dump(dataclasses.asdict(choice), f, indent=1)


def read_choice(run_dir):
    """The choice an earlier, interrupted process of this run made, or None."""
    path = os.path.join(run_dir, CHOICE_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return manifests.Budget(**json.load(f))
