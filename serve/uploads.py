"""Multipart uploads, parsed in memory by the ``multipart`` package.

werkzeug's own form parser (``request.files``) spends about 35 us on each part; ``multipart``
parses the same body in about a sixth of that (``docs/benchmarks.md``), which is a tenth of the
time a 64-image request spends outside the model. The body stays in memory: no part is ever
spooled to a temporary file, and the size limit is still Flask's ``MAX_CONTENT_LENGTH``.
"""

import multipart
from flask import current_app, request

#: Most parts one request may hold (Flask's own MAX_FORM_PARTS default).
MAX_PARTS = 1000


class UploadError(ValueError):
    """A multipart body that cannot be read; ``status`` is the HTTP code to answer with."""

    def __init__(self, message, status=400):
        super().__init__(message)
        self.status = status


def is_multipart():
    return request.mimetype == "multipart/form-data"


def parse():
    """``(fields, files)`` of the current multipart request.

    ``fields`` maps each text field's name to its first value; ``files`` lists
    ``(field name, filename, bytes)`` for every file part, in order, empty ones included
    (a browser sends an empty file input as a part with no filename and no bytes).
    Raises ``UploadError`` for a malformed body (400) or too many parts (413), and
    werkzeug's 413 when the body is over ``MAX_CONTENT_LENGTH``.
    """
    boundary = request.mimetype_params.get("boundary")
    if not boundary:
        raise UploadError("the multipart/form-data body has no boundary in its Content-Type")
    limit = current_app.config.get("MAX_CONTENT_LENGTH") or 2**31
    parser = multipart.MultipartParser(
        request.stream,  # werkzeug's stream: it raises 413 past MAX_CONTENT_LENGTH
        boundary,
        content_length=request.content_length if request.content_length is not None else -1,
        part_limit=MAX_PARTS,
        spool_limit=limit,  # every part stays in memory...
        memory_limit=limit,
        disk_limit=0,  # ...and none may go to disk
    )
    fields, files = {}, []
    try:
        for part in parser:
            if part.filename is not None:
                files.append((part.name, part.filename, part.raw))
            else:
                fields.setdefault(part.name, part.value)
    except multipart.ParserLimitReached as e:
        raise UploadError(f"the upload is too large: {e}", 413) from None
    except multipart.MultipartError as e:
        raise UploadError(f"the multipart/form-data body is malformed: {e}") from None
    return fields, files
