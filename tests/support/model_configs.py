"""TF Serving model config files for tests: the text format ``SERVE_MODEL_CONFIG_FILE`` reads."""


def config_text(name, base_path, versions=(1,), labels=None):
    """A ``model_config_list`` of one model serving ``versions`` (``specific``), with ``labels`` ({label: version})."""
    policy = "specific { " + " ".join(f"versions: {v}" for v in versions) + " }"
    entries = "".join(f'    version_labels {{ key: "{k}" value: {v} }}\n' for k, v in (labels or {}).items())
    return (f'model_config_list {{\n  config {{\n    name: "{name}"\n    base_path: "{base_path}"\n'
            f'    model_platform: "tensorflow"\n    model_version_policy {{ {policy} }}\n{entries}  }}\n}}\n')


def labelled(path, name, base_path, label="stable", version=1):
    """Write, at ``path``, a config serving ``version`` of ``base_path`` as ``name`` with one ``label``; return ``path``."""
    path.write_text(config_text(name, base_path, versions=(version,), labels={label: version}))
    return path
