"""Multipart uploads, parsed in memory by the ``multipart`` package.

It parses a body several times faster than werkzeug's own form parser (``request.files``;
figures in docs/benchmarks.md). The body stays in memory: no part is ever
spooled to a temporary file, and the size limit is still Flask's ``MAX_CONTENT_LENGTH``.
"""

import multipart
from flask import current_app, request

from serve.core.errors import BadRequest, TooLarge

#: Most parts one request may hold (Flask's own MAX_FORM_PARTS default).
MAX_PARTS = 1000
#: Longest header line of a part. The package's default (4 kB) refused a real image whose file
#: name was a few thousand characters; names that long are odd but harmless, and are
#: shortened to ``MAX_FILENAME_CHARS`` in every answer.
MAX_HEADER_BYTES = 64 * 1024
#: Most header lines in one part (Content-Disposition, Content-Type and a few more).
MAX_HEADERS = 16
#: Longest file name an answer repeats; longer ones keep their start and their end.
MAX_FILENAME_CHARS = 200


def is_multipart():
    return request.mimetype == "multipart/form-data"


def parse():
    """``(fields, files)`` of the current multipart request.

    ``fields`` maps each text field's name to its first value; ``files`` lists
    ``(field name, filename, bytes)`` for every file part, in order, empty ones included
    (a browser sends an empty file input as a part with no filename and no bytes); a
    filename longer than ``MAX_FILENAME_CHARS`` comes shortened.
    Raises ``BadRequest`` for a malformed body or part headers over the limits, ``TooLarge`` for
    too many parts, and werkzeug's 413 when the body is over ``MAX_CONTENT_LENGTH``.
    """
    boundary = request.mimetype_params.get("boundary")
    if not boundary:
        raise BadRequest("the multipart/form-data body has no boundary in its Content-Type")
    limit = current_app.extensions["serve.settings"].max_upload_bytes
    parser = multipart.MultipartParser(
        request.stream,  # werkzeug's stream: it raises 413 past MAX_CONTENT_LENGTH
        boundary,
        content_length=request.content_length if request.content_length is not None else -1,
        part_limit=MAX_PARTS,
        header_limit=MAX_HEADERS,
        headersize_limit=MAX_HEADER_BYTES,
        spool_limit=limit,  # every part stays in memory...
        memory_limit=limit,
        disk_limit=0,  # ...and none may go to disk
    )
    fields, files, parts = {}, [], 0
    try:
        for part in parser:
            parts += 1
            if part.filename is not None:
                files.append((part.name, shorten(part.filename), part.raw))
            else:
                fields.setdefault(part.name, _text(part))
    except multipart.ParserLimitReached as e:
        # The body is within MAX_CONTENT_LENGTH (werkzeug's stream refuses more) and so within the memory limit:
        # the limit reached is the part count when that many parts came, else a part's headers.
        if parts >= MAX_PARTS:
            raise TooLarge(f"the upload is too large (at most {MAX_PARTS} parts): {e}") from None
        raise BadRequest(
            f"a part's headers are over the limits ({MAX_HEADERS} lines of at most "
            f"{MAX_HEADER_BYTES // 1024} KiB each; is a file name that long?): {e}"
        ) from None
    except multipart.MultipartError as e:
        raise BadRequest(f"the multipart/form-data body is malformed: {e}") from None
    return fields, files


def shorten(filename):
    """``filename``, or its start and end around an ellipsis when over ``MAX_FILENAME_CHARS``."""
    if len(filename) <= MAX_FILENAME_CHARS:
        return filename
    tail = MAX_FILENAME_CHARS // 4  # enough to keep the extension
    return f"{filename[:MAX_FILENAME_CHARS - tail - 1]}\u2026{filename[-tail:]}"


def _text(part):
    try:
        return part.value
    except UnicodeDecodeError:
        raise BadRequest(f"the form field {shorten(part.name)!r} is not UTF-8 text") from None
    except LookupError:  # Content-Type: text/plain; charset=no-such-codec
        raise BadRequest(f"the form field {shorten(part.name)!r} names a charset this server does not know") from None
