"""TF Serving's model config file (``--model_config_file``): which versions of the model to serve, and their labels.

The file is TF Serving's own ``ModelServerConfig`` in protobuf text format, read with the vendored
protos, so a config written for TF Serving works here unchanged::

    model_config_list {
      config {
        name: "cifar10"
        base_path: "/models/cifar10"
        model_platform: "tensorflow"
        model_version_policy { specific { versions: 1 versions: 2 } }
        version_labels { key: "stable" value: 1 }
        version_labels { key: "canary" value: 2 }
      }
    }

``model_version_policy`` is ``latest { num_versions: N }`` (the N newest; TF Serving's default, one),
``specific { versions: ... }`` or ``all {}``. A label may only name a version the policy serves, and
is applied only once that version is loaded, as TF Serving refuses a label to a version that is not
available. This server serves one model: the file names one ``config``.

Typical usage (``serve.settings`` checks the file at start; the local backend re-reads it)::

    config = read("/models/models.config")
    config.select([1, 2, 3])      # the versions to serve out of those published
"""

import dataclasses
import logging
import os
import re
import time
from collections.abc import Mapping

from google.protobuf import text_format

from serve.backends import published
from tfs_protos.tensorflow_serving.config import model_server_config_pb2

POLICIES = ("latest", "specific", "all")
#: What a label may be: it is part of a URL (``/v1/models/NAME/labels/LABEL``), and never a number.
LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
#: The platforms TF Serving's configs name for a SavedModel ("" is the field left out).
PLATFORMS = ("tensorflow", "")

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A model config this server refuses, and why (TF Serving's reasons where it has them)."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """One model's ``config`` entry: where its versions are, which to serve, and their labels."""

    name: str
    base_path: str
    policy: str = "latest"  # one of POLICIES
    num_versions: int = 1  # for "latest"
    versions: tuple[int, ...] = ()  # for "specific", ascending
    labels: Mapping[str, int] = dataclasses.field(default_factory=dict)
    source: str | None = None  # the file it came from (None: no file; the newest version)

    def select(self, available):
        """The versions to serve out of ``available`` (those published), ascending."""
        available = sorted(set(available))
        if self.policy == "all":
            return tuple(available)
        if self.policy == "specific":
            return tuple(v for v in available if v in self.versions)
        return tuple(available[-self.num_versions:]) if available else ()

    def unlabelled(self, loaded):
        """``(label, version)`` of the first label whose version is not in ``loaded``, else None."""
        return next(((label, v) for label, v in sorted(self.labels.items()) if v not in loaded), None)


def newest(name, base_path):
    """Without a config file: the newest version only, no labels (TF Serving's default policy)."""
    return ModelConfig(name, str(base_path))


def read(path):
    """The :class:`ModelConfig` in the file at ``path``; :class:`ConfigError` saying what is wrong."""
    return parse(read_text(path), path)


def read_text(path):
    """The text of the config file at ``path``; :class:`ConfigError` when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read the model config file {path}: {e}") from None


def parse(text, source="<text>"):
    """The :class:`ModelConfig` of a ``ModelServerConfig`` in text format (``source`` names it in errors)."""
    try:
        proto = text_format.Parse(text, model_server_config_pb2.ModelServerConfig())
    except text_format.ParseError as e:
        raise ConfigError(f"{source} is not a ModelServerConfig in text format: {e}") from None
    if proto.WhichOneof("config") != "model_config_list":
        raise ConfigError(f"{source} has no model_config_list (custom_model_config is not read by this server)")
    configs = proto.model_config_list.config
    names = [c.name for c in configs]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"{source}: Illegal to list model {name} multiple times in config list")
    if len(configs) != 1:
        raise ConfigError(f"{source} lists {len(configs)} models ({', '.join(names) or 'none'}); this server serves one")
    return _model(configs[0], source)


def _model(config, source):
    name = config.name
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise ConfigError(f"{source}: model name {name!r} must be letters, digits, '.', '_' or '-' (it is part of every URL)")
    if not config.base_path:
        raise ConfigError(f"{source}: model {name} has no base_path")
    if config.model_platform not in PLATFORMS:
        raise ConfigError(f"{source}: Model {name} requested unsupported platform {config.model_platform}")
    base_path = config.base_path
    if not os.path.isabs(base_path):  # as TF Serving reads it: from the server's working directory
        base_path = os.path.abspath(base_path)
    choice = config.model_version_policy.WhichOneof("policy_choice") or "latest"
    policy = getattr(config.model_version_policy, choice)
    num_versions, versions = 1, ()
    if choice == "latest":
        num_versions = max(1, policy.num_versions)  # unset (0) is one, as in TF Serving
    elif choice == "specific":
        versions = tuple(sorted(set(policy.versions)))
        if not versions:
            raise ConfigError(f"{source}: model {name}'s specific policy lists no versions")
        if versions[0] < 0:
            raise ConfigError(f"{source}: model {name}'s specific policy lists a negative version {versions[0]}")
    labels = dict(config.version_labels)
    for label, version in sorted(labels.items()):
        if not LABEL.fullmatch(label):
            raise ConfigError(f"{source}: label {label!r} of model {name} must be letters, digits, '_' or '-', "
                              "starting with a letter or '_'")
        if choice == "specific" and version not in versions:
            raise ConfigError(f"{source}: Request to assign label {label} to version {version} of model {name}, "
                              f"which is not in its specific policy (versions {', '.join(map(str, versions))})")
    return ModelConfig(name, base_path, choice, num_versions, versions, labels, source)


def check_published(config):
    """:class:`ConfigError` when a label names a version the policy will not serve out of those published now.

    What ``serve.settings`` checks at start, so that such a config stops the server with one line,
    as TF Serving's start fails on it.
    """
    published_now = published.versions(config.base_path)
    missing = config.unlabelled(config.select(published_now))
    if missing is not None:
        label, version = missing
        raise ConfigError(f"{config.source}: Request to assign label {label} to version {version} of model "
                          f"{config.name}, which is not currently available for inference "
                          f"(published: {', '.join(map(str, published_now))}; served by the policy: "
                          f"{', '.join(map(str, config.select(published_now))) or 'none'})")
    return config


class Watched:
    """A config file read at start and read again, at most every ``poll_s`` seconds (0: never), when asked.

    Not thread-safe by design and harmless so: two threads reading the same file at once find the same text.
    """

    def __init__(self, path, poll_s):
        self.path, self.poll_s = path, float(poll_s)
        self._text = read_text(path)
        self.config = parse(self._text, path)
        self._read_at = time.monotonic()

    def poll(self, now, current):
        """A new :class:`ModelConfig` when the file changed and is valid, else None (a refusal is logged once).

        ``current`` is the config in force: a new one may not change its model's name or ``base_path``.
        """
        if self.poll_s <= 0 or now - self._read_at < self.poll_s:
            return None
        self._read_at = now
        try:
            text = read_text(self.path)
        except ConfigError as e:
            log.error("%s; keeping the model config read before", e)
            return None
        if text == self._text:
            return None
        self._text = text
        try:
            config = parse(text, self.path)
            if (config.name, config.base_path) != (current.name, current.base_path):
                raise ConfigError(f"{self.path}: changing the model's name or base_path needs a restart "
                                  f"(serving {current.name} from {current.base_path})")
        except ConfigError as e:
            log.error("model config refused: %s; keeping the one read before", e)
            return None
        log.info("model config %s read: %s versions %s, labels %s", self.path, config.policy,
                 list(config.versions) or config.num_versions, dict(config.labels))
        self.config = config
        return config
