"""What TF Serving's REST and gRPC APIs share: its words for a model it does not serve, its version states,
its metadata, and how its ``predict_images`` and ``serving_default`` signatures reach the core."""

from serve.core.errors import NotServed

#: What a status answer says of a version, as TF Serving's ``ModelVersionStatus`` does.
OK_STATUS = {"error_code": "OK", "error_message": ""}


def not_found(e: NotServed):
    """A :class:`NotServed` in TF Serving's own words (its name, version or label bounded and escaped)."""
    if e.label is not None:
        return f"Unrecognized servable version label: {bounded(e.label)}"
    if e.version is not None:
        return f"Servable not found for request: Specific({bounded(e.name)}, {bounded(e.version)})"
    return f"Servable not found for request: Latest({bounded(e.name)})"


def states(info, named):
    """``[(version, state)]`` a status answer lists: every version the server knows, newest first, or the one named."""
    return [(info.version, "AVAILABLE")] if named else info.version_states()


def metadata(info):
    """The ``signature_def`` map of TF Serving's metadata, in its JSON form."""
    return {"signature_def": {name: signature.json() for name, signature in info.signatures.items()}}


def bounded(value, limit=80):
    """A name from a request as TF Serving's messages repeat it, unquoted: printable and at most ``limit`` characters."""
    text = "" if value is None else str(value)
    text = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"
