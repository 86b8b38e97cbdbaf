"""``/``: an upload form that works without JavaScript, and the page of results.

With JavaScript, ``serve/static/page.js`` enhances the same form (drop, paste, thumbnails, results in
place from ``/api/v1/predict``); the limits it batches by and the "not sure" threshold come from the
form's ``data-`` attributes, rendered here.
"""

import base64

from flask import Blueprint, render_template

from serve.core.errors import BadRequest, ServeError, TooLarge, TooManyImages
from serve.core.request import Answered, Upload
from serve.protocols import api, multipart, settings

bp = Blueprint("web", __name__)

#: Below this top-class probability the page says "not sure: A or B" instead of one bold label.
NOT_SURE_BELOW = 0.5
MIME_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "BMP": "image/bmp", "WEBP": "image/webp"}
_WORDS = ("", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")


@bp.get("/")
def index():
    return _page(top_k=settings().top_k)


def _page(**context):
    """``index.html`` with ``context``, and what the page's script needs to know of this server."""
    return render_template("index.html", not_sure_below=NOT_SURE_BELOW, limits=settings(), **context)


@bp.post("/")
def upload():
    top_k = settings().top_k
    try:
        fields, files = multipart.parse() if multipart.is_multipart() else ({}, [])
    except ServeError as e:
        return render_error(f"The upload cannot be read: {e}.", e.status)
    try:
        top_k = api.parse_top_k(fields.get("top_k")) or top_k
        # A file input left empty still sends one part, with no name and no bytes.
        images = [Upload(filename, data) for _, filename, data in files if data or filename]
        if not images:
            return render_error("Choose one or more image files first.", 400, top_k)
        answer = api.classify(images, top_k)
    except TooManyImages as e:
        return _refused(f"Too many files: {e}.", e, top_k)
    except TooLarge as e:
        return _refused(f"The upload is too large: {e}.", e, top_k)
    except BadRequest as e:
        return _refused(str(e), e, top_k)
    except ServeError as e:
        return _refused(f"The model is not available: {e}", e, top_k)
    results = [_shown(image) for image in answer.images]
    status = answer.images[0].status if answer.all_refused else 200
    return _page(
        top_k=top_k, results=results,
        model={"name": answer.model.name, "version": answer.version, "architecture": answer.model.architecture},
        runtime=answer.model.runtime, class_count=_count_words(len(answer.model.class_names or ())) or "known",
    ), status


def _refused(message, e, top_k):
    page, status = render_error(message, e.status, top_k)
    return page, status, {"Retry-After": str(e.retry_after)} if e.retry_after is not None else {}


def _shown(image):
    """One image as the page shows it: the public fields, and the upload back as a ``data:`` URL."""
    shown = image.public()
    if isinstance(image, Answered):
        encoded = base64.b64encode(image.data).decode("ascii")
        shown["data_url"] = f"data:{MIME_TYPES.get(image.format, 'application/octet-stream')};base64,{encoded}"
    return shown


def _count_words(n):
    """``10`` as "ten", as a person would write it; larger counts as digits; 0 (unknown) as ""."""
    return _WORDS[n] if n < len(_WORDS) else str(n)


def render_error(message, status, top_k=None):
    """The form page with ``message`` on it (also for a 401, 413 or 429 answered before the view)."""
    return _page(top_k=top_k or settings().top_k, error=message), status
