"""What a run shows while it trains, in lines a log file keeps, and the time budget's place in the fit.

Keras's own progress prints one line an epoch to a file (and its bar shows nothing in a log until
the epoch ends); :class:`Progress` prints, flushed, a line every :data:`EVERY_S` seconds (the step,
the time gone, the time left, the loss) and one at each epoch's end. Given a
:class:`train.budget.Timer`, it also makes the time budget's choice when the timer has timed enough
steps: the schedule's length is set to the chosen epochs, the choice is kept in the run directory for
a resumed run, and training stops at the end of the chosen epoch.
"""

import time

import keras

from train import budget, schedules

EVERY_S = 30  # seconds between progress lines in a log (the trainer passes 10 on a terminal)


def clock_text(seconds):
    """``seconds`` as ``1h02m``, ``4m05s`` or ``37s``."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class Progress(keras.callbacks.Callback):
    """Progress lines on ``say`` (flushed ``print`` by default), and the time budget's choice.

    Args:
      epochs: the run's length (the recipe's; the budget's choice, once made, replaces it).
      steps_per_epoch: steps in an epoch.
      started: ``clock()`` when the run began; "gone" and the budget count from there.
      clock: seconds, monotonic (tests pass a fake one); read once at each step's end.
      timer: a :class:`train.budget.Timer` to choose the run's length with, or None.
      run_dir: where the choice is kept (:func:`train.budget.write_choice`), with a timer.
      every_s: seconds between progress lines.
      verbose: 0 says nothing (the choice is still made and kept).
      handover_steps: what follows the last step, in steps' time, for the time left (train.budget.handover_steps).
    """

    def __init__(self, epochs, steps_per_epoch, started, clock=time.monotonic, timer=None, run_dir=None,
                 every_s=EVERY_S, verbose=1, say=None, handover_steps=0.0):
        super().__init__()
        self.epochs, self.steps_per_epoch, self.started, self.clock = epochs, steps_per_epoch, started, clock
        self.handover_steps = handover_steps
        self.timer, self.run_dir, self.every_s, self.verbose = timer, run_dir, every_s, verbose
        self.say = say or (lambda line: print(line, flush=True))
        self.choice = None
        self.epoch = 0
        self.first_end = None  # (clock, step) at this process's first step's end: compile and step
        self.last_line = None
        self.last = None  # (clock, step) at the latest step's end

    def _line(self, text):
        if self.verbose:
            self.say(text)

    def on_train_begin(self, logs=None):
        if self.timer is not None:
            self.timer.began_training(self.clock())

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        now = self.clock()
        step = self.epoch * self.steps_per_epoch + batch + 1
        if self.first_end is None:
            self.first_end = (now, step)
            self.last_line = now
        self.last = (now, step)
        if self.timer is not None and self.choice is None:
            choice = self.timer.step_ended(now, step)
            if choice is not None:
                self.choose(choice)
        if now - self.last_line >= self.every_s:
            self.last_line = now
            loss = (logs or {}).get("loss")
            self._line(f"epoch {self.epoch + 1}/{self.epochs}, step {step}/{self.epochs * self.steps_per_epoch}: "
                       f"{clock_text(now - self.started)} gone, about {clock_text(self.left(now, step))} left"
                       + (f", loss {loss:.4f}" if loss is not None else ""))

    def choose(self, choice):
        """Take ``choice`` (a contract.manifest.Budget): the schedule's length, the file a resume reads, the line."""
        self.choice = choice
        self.epochs = choice.epochs
        schedules.length(self.model.optimizer).assign(float(choice.epochs * self.steps_per_epoch))
        if self.run_dir is not None:
            budget.write_choice(self.run_dir, choice)
        self._line(budget.describe(choice))

    def step_seconds(self):
        """The mean step since this process's first (which compiled), or None before the second."""
        if self.first_end is None or self.last[1] == self.first_end[1]:
            return None
        return (self.last[0] - self.first_end[0]) / (self.last[1] - self.first_end[1])

    def left(self, now, step):
        """Seconds left: the steps to go and the handover, at the mean step so far."""
        step_s = self.step_seconds()
        if step_s is None:
            return 0.0
        return (self.epochs * self.steps_per_epoch - step + self.handover_steps) * step_s

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        if self.last is not None:
            now, step = self.clock(), self.last[1]
            shown = [f"{name} {logs[name]:.4f}" for name in ("loss", "accuracy", "val_loss", "val_accuracy")
                     if isinstance(logs.get(name), (int, float))]
            took = f" in {logs['epoch_time_s']:.1f} s" if isinstance(logs.get("epoch_time_s"), float) else ""
            self._line(f"epoch {epoch + 1}/{self.epochs} done{took}: {', '.join(shown)}; "
                       f"{clock_text(now - self.started)} gone, about {clock_text(self.left(now, step))} left")
        if epoch + 1 >= self.epochs:
            self.model.stop_training = True
