"""The registry of model builders and their training recipes (:class:`contract.recipe.Recipe`), looked up by name.

Each model module registers its builders with :func:`register` when it is imported; the
registry imports those modules itself (:data:`MODEL_MODULES`) the first time a name is looked
up, so no module has to import another at its bottom to fill it.
"""

import dataclasses
import importlib

from contract.recipe import Recipe

#: The modules whose builders the registry holds; each registers its own when imported.
MODEL_MODULES = ("train.models", "train.airbench")

_REGISTRY = {}  # name -> _Registered


def register(name, recipe=Recipe(), prepare=None, callbacks=None):
    """Add a builder to the registry under ``name``, with its default training recipe.

    ``prepare(model, x_train)``, if given, initialises weights from the training images before
    training (the weights file then carries the result, so export needs no data).
    ``callbacks(total_steps)``, if given, returns the Keras callbacks its recipe trains with; ``total_steps``
    is the run's length in steps, or a function that returns it (a time budget chooses it after the first steps).
    """

    def decorator(builder):
        _REGISTRY[name] = _Registered(builder, recipe, prepare, callbacks)
        return builder

    return decorator


@dataclasses.dataclass(frozen=True)
class _Registered:
    builder: object
    recipe: Recipe
    prepare: object  # prepare(model, x_train), or None
    callbacks: object  # callbacks(total_steps) -> [keras.callbacks.Callback], or None


def _registered(name):
    _import_models()
    if name not in _REGISTRY:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(model_names())}")
    return _REGISTRY[name]


def prepare(name, model, x_train):
    """Run the model's data-dependent initialisation on uint8 training images, if it has one."""
    entry = _registered(name)
    if entry.prepare is not None:
        entry.prepare(model, x_train)


def recipe(name):
    return _registered(name).recipe


def training_callbacks(name, total_steps):
    """The callbacks the model's recipe trains with (none for most models)."""
    entry = _registered(name)
    return [] if entry.callbacks is None else entry.callbacks(total_steps)


def model_names():
    _import_models()
    return sorted(_REGISTRY)


def build_model(name, num_classes, **kwargs):
    """Build the registered model ``name``; raises ValueError naming the known ones."""
    return _registered(name).builder(num_classes=num_classes, **kwargs)




def _import_models():
    for module in MODEL_MODULES:
        importlib.import_module(module)  # a no-op once imported
