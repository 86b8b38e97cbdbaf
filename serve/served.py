"""Which model and versions this server answers for: the one 404 rule of the TF Serving and v2 routes,
and the one way ``/readyz`` and ``/api/v1/model`` list the versions it refused to load."""

from flask import current_app

from serve.errors import ServeError


def metadata(name, version, unknown_model, unknown_version):
    """The backend's metadata, once ``name`` is the served model and ``version`` (None: any) one of its versions.

    ``unknown_model(name)`` and ``unknown_version(name, version, versions)`` word the 404 as each
    protocol words it; the rule is the same for both.
    """
    if name != current_app.config["MODEL_NAME"]:
        raise ServeError(unknown_model(name), 404)
    meta = current_app.extensions["serve.backend"].metadata()
    if version is not None and str(version) not in [str(v) for v in meta["versions"]]:
        raise ServeError(unknown_version(name, version, meta["versions"]), 404)
    return meta


def skipped_versions(skipped):
    """A backend's ``{version: reason}`` of versions it refused to load as ``[{"version", "reason"}]``, oldest first."""
    return [{"version": v, "reason": why} for v, why in sorted((skipped or {}).items())]
