"""One meaning per word on every command line: the renamed options are what --help shows, and their old
spellings still work for one release, with a one-line deprecation note on stderr the first time."""

import pytest


def _train_parser():
    from train import cli

    return cli.build_parser()


def _export_parser():
    from export import exporter

    return exporter.build_parser()


def _client_parser():
    from client import cli

    return cli.build_parser()


# (parser, the arguments every parse needs, new spelling, old spelling, a value, the attribute it sets)
RENAMED = [
    (_train_parser, [], "--keras-backend", "--backend", "jax", "keras_backend"),
    (_export_parser, ["--run", "runs/seed"], "--model-name", "--name", "other", "model_name"),
    (_client_parser, ["predict", "cat.png"], "--model-name", "--model", "other", "model_name"),
]
IDS = ["train-keras-backend", "export-model-name", "client-model-name"]


def _help(make, required):
    parser = make()
    if required and required[0] == "predict":  # the client's options live on its subcommands
        return parser._subparsers._group_actions[0].choices["predict"].format_help()
    return parser.format_help()


@pytest.mark.parametrize("make, required, new, old, value, dest", RENAMED, ids=IDS)
def test_the_help_shows_the_new_name_only(make, required, new, old, value, dest):
    text = _help(make, required)
    assert new in text
    assert old not in text.replace(new, "")


@pytest.mark.parametrize("make, required, new, old, value, dest", RENAMED, ids=IDS)
def test_the_new_name_sets_the_value_quietly(make, required, new, old, value, dest, capsys):
    args = make().parse_args([*required, new, value])
    assert getattr(args, dest) == value
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("make, required, new, old, value, dest", RENAMED, ids=IDS)
def test_the_old_spelling_still_works_and_says_so_once(make, required, new, old, value, dest, capsys):
    args = make().parse_args([*required, old, value, old, value])
    assert getattr(args, dest) == value
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{old} is deprecated" in err and f"use {new}" in err


@pytest.mark.parametrize("make, required, new, old, value, dest", RENAMED, ids=IDS)
def test_without_either_the_default_holds(make, required, new, old, value, dest):
    default = make().parse_args(required)
    assert getattr(default, dest) not in (None, value)


def test_the_train_backend_keeps_its_choices_under_the_old_spelling(capsys):
    with pytest.raises(SystemExit):
        _train_parser().parse_args(["--backend", "torch"])
    assert "invalid choice: 'torch'" in capsys.readouterr().err
