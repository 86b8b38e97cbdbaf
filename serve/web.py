"""``/``: an upload form that works without JavaScript, and the page of results."""

from flask import Blueprint, current_app, render_template

from serve import classify
from serve import images as imaging
from serve import uploads as multipart_uploads
from serve.errors import ServeError, check_image_count

bp = Blueprint("web", __name__)


@bp.get("/")
def index():
    return render_template("index.html", top_k=current_app.config["TOP_K"])


@bp.post("/")
def upload():
    default_k = current_app.config["TOP_K"]
    fields, files = {}, []
    try:
        if multipart_uploads.is_multipart():
            fields, files = multipart_uploads.parse()
        top_k = classify.parse_top_k(fields.get("top_k"), default_k)
    except ServeError as e:
        return render_template("index.html", top_k=default_k, error=f"The upload cannot be read: {e}."), e.status
    except ValueError as e:
        return render_template("index.html", top_k=default_k, error=str(e)), 400
    # A file input left empty still sends one part, with no name and no bytes.
    uploads = [classify.Upload(filename, data) for _, filename, data in files if data or filename]
    if not uploads:
        return render_template("index.html", top_k=top_k, error="Choose one or more image files first."), 400
    try:
        check_image_count(len(uploads), current_app.config["MAX_IMAGES"])
    except ServeError as e:
        return render_template("index.html", top_k=top_k, error=f"Too many files: {e}."), e.status
    try:
        meta, slots = current_app.extensions["serve.classifier"].classify(uploads, top_k)
    except ServeError as e:
        return render_template("index.html", top_k=top_k, error=f"The model is not available: {e}"), e.status
    for slot in slots:
        if "data" in slot:
            slot["data_url"] = imaging.data_url(slot.pop("data"), slot["format"])
    status = 200 if any("error" not in s for s in slots) else slots[0]["status"]
    return render_template(
        "index.html", top_k=top_k, results=slots, model=classify.model_info(meta), runtime=meta.get("runtime"),
        class_count=_count_words(len(meta.get("class_names") or ())) or "known",
    ), status


_WORDS = ("", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")


def _count_words(n):
    """``10`` as "ten", as a person would write it; larger counts as digits; 0 (unknown) as ""."""
    return _WORDS[n] if n < len(_WORDS) else str(n)


def render_error(message, status):
    """The form page with ``message`` on it (used for a 413 on the form)."""
    return render_template("index.html", top_k=current_app.config["TOP_K"], error=message), status
