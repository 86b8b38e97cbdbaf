"""The time budget (train.budget, train.progress): the length it chooses, on a fake clock, and what it records."""

import json
import os
import subprocess
import sys

import pytest

from contract import MANIFEST_FILE
from contract import manifest as manifests
from train import budget, report, trainer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUPPORT = os.path.join(REPO, "tests", "support")


# --- the choice, in numbers ---------------------------------------------------------------------


@pytest.mark.parametrize("budget_s, epochs", [
    (1000.0, 10),  # everything fits: the recipe's length, never more
    (20 + (10 * 22 - 6) * 2 + 16, 10),  # exactly on the budget counts as fitting
    (20 + (10 * 22 - 6) * 2 + 15.9, 9),
    (300.0, 6),  # 20 + (132 - 6) * 2 + 16 = 288 fits; 7 epochs would be 332
    (50.0, 1),  # not even one epoch fits: the epoch under way, the least a run can train
])
def test_the_choice_is_the_most_epochs_predicted_to_end_inside_the_budget(budget_s, epochs):
    chosen, predicted = budget.choose(budget_s, elapsed_s=20.0, steps_done=6, step_s=2.0, steps_per_epoch=22,
                                      max_epochs=10, reserve_s=16.0)
    assert chosen == epochs
    assert predicted == 20 + (epochs * 22 - 6) * 2 + 16
    assert predicted <= budget_s or epochs == 1


def test_a_choice_made_in_a_later_epoch_never_ends_before_it():
    chosen, _ = budget.choose(10.0, elapsed_s=100.0, steps_done=30, step_s=1.0, steps_per_epoch=12, max_epochs=6,
                              reserve_s=0.0)
    assert chosen == 3  # step 30 is in the third epoch


def _timed(timer, ends):
    """Feed ``timer`` step ends ``[(clock, steps taken)]``; the choices it returned, with the step that made each."""
    made = []
    for now, step in ends:
        choice = timer.step_ended(now, step)
        if choice is not None:
            made.append((step, choice))
    return made


def test_the_timer_times_steps_after_the_compiling_one_and_chooses_once():
    timer = budget.Timer(300, started=100.0, steps_per_epoch=22, max_epochs=10, handover_steps=8, timed_steps=5)
    timer.began_training(120.0)  # 20 s of loading and building before the first step
    # The first step ends 12 s later (10 s compiling); then steps of 2 s with one slow one of 7 s.
    ends = [(132.0, 1), (134.0, 2), (136.0, 3), (143.0, 4), (145.0, 5), (147.0, 6), (149.0, 7), (151.0, 8)]
    made = _timed(timer, ends)
    assert [step for step, _ in made] == [6], "after 5 steps timed past the first, and only once"
    choice = made[0][1]
    assert choice.step_s == 2.0, "the median, which the slow step does not move"
    assert (choice.timed_steps, choice.compile_s, choice.elapsed_s, choice.steps_done) == (5, 10.0, 47.0, 6)
    assert choice.reserve_s == 16.0
    # 47 + (5 * 22 - 6) * 2 + 16 = 271 fits 300; six epochs would be 315.
    assert (choice.epochs, choice.max_epochs, choice.predicted_s, choice.seconds) == (5, 10, 271.0, 300.0)


def test_with_several_steps_a_call_each_call_is_divided_by_its_steps():
    timer = budget.Timer(10_000, started=0.0, steps_per_epoch=64, max_epochs=4, handover_steps=8, timed_steps=5)
    timer.began_training(0.0)
    made = _timed(timer, [(40.0, 4), (44.0, 8), (48.0, 12)])  # 4 steps a call, 1 s a step
    assert len(made) == 1 and made[0][0] == 12
    assert (made[0][1].step_s, made[0][1].compile_s, made[0][1].timed_steps, made[0][1].epochs) == (1.0, 36.0, 8, 4)


def test_a_run_shorter_than_the_timing_chooses_at_its_last_step():
    timer = budget.Timer(100, started=0.0, steps_per_epoch=2, max_epochs=2, handover_steps=8, timed_steps=5)
    timer.began_training(0.0)
    made = _timed(timer, [(5.0, 1), (6.0, 2), (7.0, 3), (8.0, 4)])
    assert [step for step, _ in made] == [4] and made[0][1].epochs == 2


def test_a_budget_of_no_time_is_refused():
    with pytest.raises(ValueError, match="more than 0 seconds"):
        budget.Timer(0, started=0.0, steps_per_epoch=2, max_epochs=2, handover_steps=8)


def _choice(**changes):
    fields = dict(seconds=300.0, epochs=5, max_epochs=10, steps_per_epoch=22, step_s=2.0, timed_steps=5, compile_s=10.0,
                  elapsed_s=47.0, steps_done=6, reserve_s=16.0, predicted_s=271.0)
    return manifests.Budget(**{**fields, **changes})


def test_the_line_says_what_was_chosen_and_why():
    line = budget.describe(_choice())
    for part in ("time budget 300 s", "5 of the recipe's 10 epochs", "110 steps", "a step takes 2.00 s",
                 "10.0 s more to compile", "predicted 271 s", "6 epochs would take 315 s"):
        assert part in line, part
    assert "OVER" not in line
    assert "OVER THE BUDGET" in budget.describe(_choice(seconds=50.0, epochs=1, predicted_s=95.0))


def test_the_choice_is_kept_for_a_resumed_run(tmp_path):
    assert budget.read_choice(str(tmp_path)) is None
    budget.write_choice(str(tmp_path), _choice())
    assert budget.read_choice(str(tmp_path)) == _choice()


# --- the schedule's length --------------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["linear", "triangle", "onecycle"])
def test_a_schedule_over_a_fixed_length_is_the_one_it_replaced(schedule):
    """The variable length gives the rates Keras's schedules (and train.schedules.triangle) gave at a fixed one."""
    import dataclasses

    import keras
    import numpy as np

    from train import models, schedules

    total, peak = 154, 1.66
    recipe = dataclasses.replace(models.recipe("seed_cnn"), optimizer="sgd", warmup_fraction=0.23)
    warmup = max(1, int(total * recipe.warmup_fraction))
    reference = {
        "linear": keras.optimizers.schedules.PolynomialDecay(peak, total, end_learning_rate=0.0),
        "triangle": schedules.triangle(peak, warmup, total),
        "onecycle": keras.optimizers.schedules.CosineDecay(peak / 10, decay_steps=total - warmup, alpha=0.0,
                                                           warmup_target=peak, warmup_steps=warmup),
    }[schedule]
    optimizer = schedules.optimizer(recipe, peak, schedule, total)
    got, want = [], []
    for step in range(0, total + 5):
        optimizer.iterations.assign(step)
        got.append(float(optimizer.learning_rate))
        want.append(float(reference(step)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_new_length_ends_the_schedule_at_its_end():
    import dataclasses

    from train import models, schedules

    optimizer = schedules.optimizer(dataclasses.replace(models.recipe("airbench_muon")), 1.0, "linear", 220)
    schedules.length(optimizer).assign(154.0)
    for step, rate in ((0, 1.0), (77, 0.5), (154, 0.0), (200, 0.0)):
        optimizer.iterations.assign(step)
        assert float(optimizer.learning_rate) == pytest.approx(rate, abs=1e-6)


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_the_compiled_step_reads_the_length_set_during_the_fit(backend):
    """Under JAX too, where the step reads only the state it is given: the length is the optimizer's."""
    sys.path.insert(0, SUPPORT)
    import schedule_length_fit as fit

    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu"}
    result = subprocess.run([sys.executable, os.path.join(SUPPORT, "schedule_length_fit.py")], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    rates = [fit.PEAK * (1 - step / (fit.FIRST_LENGTH if step < fit.CHANGED_AFTER else fit.SECOND_LENGTH))
             for step in range(fit.STEPS)]
    unchanged = [fit.PEAK * (1 - step / fit.FIRST_LENGTH) for step in range(fit.STEPS)]
    assert out["backend"] == backend
    assert out["weight"] == pytest.approx(-sum(rates), abs=1e-5)
    assert abs(out["weight"] + sum(unchanged)) > 0.5  # what a step blind to the new length would give


# --- a run with a budget ---------------------------------------------------------------------


class FakeClock:
    """One second passes at every reading; ``stop_at`` readings in, the run is killed (an exception)."""

    def __init__(self, stop_at=None):
        self.now, self.readings, self.stop_at = 1000.0, 0, stop_at

    def __call__(self):
        self.readings += 1
        if self.stop_at is not None and self.readings >= self.stop_at:
            raise Killed()
        self.now += 1.0
        return self.now


class Killed(Exception):
    pass


def _config(output, time_budget, verbose=2):
    # seed_cnn on the small synthetic set: 144 training images, 12 steps of 12 an epoch, 6 epochs at most.
    return trainer.Config(output=str(output), model="seed_cnn", precision="float32", tpu="none", holdout=48,
                          recipe={"epochs": 6, "batch_size": 12}, time_budget=time_budget, verbose=verbose,
                          validation_freq=100)


def test_a_budgeted_run_trains_the_epochs_it_chose_and_its_manifest_says_why(tmp_path, splits, capsys):
    clock = FakeClock()
    manifest = trainer.run(_config(tmp_path / "run", 70.0), splits=splits, clock=clock)
    chosen = manifest["training"]["budget"]
    # The callback reads the clock once a step, so on this clock a step takes exactly one second.
    assert chosen["step_s"] == 1.0 and chosen["timed_steps"] == budget.TIMED_STEPS
    # The handover evaluates the 48 test images: 8 x 48 images' time, 32 steps of 12.
    assert chosen["reserve_s"] == budget.handover_steps(12, len(splits.x_test)) == 32.0
    assert chosen["max_epochs"] == 6 and 1 <= chosen["epochs"] < 6, "70 s cannot hold six epochs of 12 s"
    assert chosen["predicted_s"] <= 70.0
    # The manifest's recipe is what was trained; the history has exactly the chosen epochs.
    assert manifest["training"]["recipe"]["epochs"] == chosen["epochs"]
    assert len(report.read_history(str(tmp_path / "run" / "history.csv"))) == chosen["epochs"]
    assert manifests.read(str(tmp_path / "run" / MANIFEST_FILE)).training.budget == manifests.Budget(**chosen)
    out = capsys.readouterr().out
    assert budget.describe(manifests.Budget(**chosen)) in out
    assert f"epoch {chosen['epochs']}/{chosen['epochs']} done" in out
    assert f"epoch {chosen['epochs'] + 1}/" not in out


def test_a_run_without_a_budget_records_none_and_trains_the_recipe(tmp_path, splits):
    manifest = trainer.run(_config(tmp_path / "run", None, verbose=0), splits=splits, clock=FakeClock())
    assert manifest["training"]["budget"] is None and manifest["training"]["recipe"]["epochs"] == 6
    assert not (tmp_path / "run" / budget.CHOICE_FILE).exists()


def test_a_resumed_run_keeps_the_length_chosen_before_it_was_killed(tmp_path, splits, capsys):
    output = tmp_path / "run"
    # Killed in its second epoch: one epoch backed up, the choice made in the first.
    with pytest.raises(Killed):
        trainer.run(_config(output, 70.0), splits=splits, clock=FakeClock(stop_at=22))
    first = budget.read_choice(str(output))
    assert first is not None and first.epochs < 6
    assert len(report.read_history(str(output / "history.csv"))) == 1
    # The same run again with another budget: the schedule its backup was trained on stays.
    manifest = trainer.run(_config(output, 10_000.0), splits=splits, clock=FakeClock())
    assert manifests.Budget(**manifest["training"]["budget"]) == first
    assert manifest["training"]["recipe"]["epochs"] == first.epochs
    assert [row["epoch"] for row in report.read_history(str(output / "history.csv"))] == list(range(first.epochs))
    assert "resuming with the length chosen when this run began" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--time-budget", "0"], "argument --time-budget: must be positive, got 0"),
    (["--time-budget", "soon"], "argument --time-budget: 'soon' is not a number"),
])
def test_a_bad_budget_is_one_line_and_exit_2(argv, message, capsys):
    from train import cli

    with pytest.raises(SystemExit) as exit:
        cli.main(argv)
    assert exit.value.code == 2 and message in capsys.readouterr().err


def test_validation_freq_0_evaluates_only_at_the_end(tmp_path, splits):
    """The main job's setting: no evaluation on the test split between epochs, the test accuracy measured at the end."""
    import dataclasses

    manifest = trainer.run(dataclasses.replace(_config(tmp_path / "run", None, verbose=0), validation_freq=0),
                           splits=splits, clock=FakeClock())
    rows = report.read_history(str(tmp_path / "run" / "history.csv"))
    assert len(rows) == 6 and not any(key.startswith("val_") for row in rows for key in row)
    assert manifest["metrics"]["test_images"] == len(splits.x_test) and manifest["metrics"]["test_accuracy"] > 0.5
