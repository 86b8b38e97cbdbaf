"""The registry of model builders and their training recipes, looked up by name.

Each model module registers its builders with :func:`register` when it is imported; the
registry imports those modules itself (:data:`MODEL_MODULES`) the first time a name is looked
up, so no module has to import another at its bottom to fill it.
"""

import dataclasses
import importlib

#: The modules whose builders the registry holds; each registers its own when imported.
MODEL_MODULES = ("train.models", "train.airbench")

_REGISTRY = {}  # name -> _Registered


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A model's default training hyperparameters; every CLI flag can override them."""

    optimizer: str = "adam"  # "adam", "sgd" (Keras's Nesterov SGD) or "sgd_pytorch" (the same in PyTorch's form)
    learning_rate: float = 1e-3  # peak learning rate at reference_batch images per step
    reference_batch: int = 128  # global batch the learning rate is quoted for, images
    lr_scaling: str = "sqrt"  # how the rate follows the global batch: "sqrt" (Adam) or "linear" (SGD)
    schedule: str = "constant"  # "constant", or "onecycle": linear warmup then cosine decay to ~0
    warmup_fraction: float = 0.2  # one-cycle warmup, as a fraction of all steps
    epochs: int = 50  # passes over the training set
    batch_size: int = 128  # images per replica per step
    augment: bool = False  # random crop after padding, and horizontal flip
    alternate_flips: bool = False  # with augment: each image mirrored in every other epoch, not at random
    crop_padding: int = 4  # pixels of reflection padding before the random crop; 0: flip only
    label_smoothing: float = 0.0  # fraction of target mass spread over all classes
    weight_decay: float = 0.0  # decoupled weight decay per step, multiplied by the learning rate
    momentum: float = 0.9  # SGD only


def register(name, recipe=Recipe(), prepare=None, callbacks=None):
    """Add a builder to the registry under ``name``, with its default training recipe.

    ``prepare(model, x_train)``, if given, initialises weights from the training images before
    training (the weights file then carries the result, so export needs no data).
    ``callbacks(total_steps)``, if given, returns the Keras callbacks its recipe trains with.
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
