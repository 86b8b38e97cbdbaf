"""The upload page with JavaScript (serve/static/page.js) in real headless Chromium: drop, paste,
thumbnails, results in place in batches with progress, errors in place, the fallback to the form,
the same wording as the form's own results page, keyboard use and axe-core's audit.

Two kinds of server: the session's gunicorn server over a real exported model (``live_server``), and
an in-process one over a fake backend whose answers are known (confident, "not sure", foreign), for
the wording, errors, keys and limits.
"""

import base64
import contextlib
import os
import threading

import numpy as np
import pytest

import synthetic
from live_server import live_server  # noqa: F401  (imported for its fixture)

CHROMIUM = "/usr/bin/chromium"
DONE = "#results[aria-busy=false]"  # page.js sets it when a run of batches has ended

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed (apt-get install chromium)"
)

# Records what page.js sends: the number of files in each request's FormData.
COUNT_SENT = """
window.__sent = [];
const realFetch = window.fetch;
window.fetch = (url, init) => {
  if (init && init.body instanceof FormData) window.__sent.push(init.body.getAll("file").length);
  return realFetch(url, init);
};
"""
# Builds a DataTransfer in the page from [{name, type, b64}] and dispatches it as a drop or a paste.
DISPATCH = """
([kind, files]) => {
  const transfer = new DataTransfer();
  for (const f of files) {
    const bytes = Uint8Array.from(atob(f.b64), (c) => c.charCodeAt(0));
    transfer.items.add(new File([bytes], f.name, { type: f.type }));
  }
  const target = document.getElementById("drop");
  if (kind === "paste") return target.dispatchEvent(new ClipboardEvent("paste", { clipboardData: transfer, bubbles: true, cancelable: true }));
  target.dispatchEvent(new DragEvent("dragover", { dataTransfer: transfer, bubbles: true, cancelable: true }));
  return target.dispatchEvent(new DragEvent("drop", { dataTransfer: transfer, bubbles: true, cancelable: true }));
}
"""


def _png_file(name, image):
    return {"name": name, "type": "image/png", "b64": base64.b64encode(synthetic.encode(image)).decode()}


def _synthetic_files(count, seed=9):
    images, _ = synthetic.make_images(count, seed=seed)
    return [_png_file(f"upload{i}.png", image) for i, image in enumerate(images[:count])]


def _solid(name, rgb):
    return _png_file(name, np.full((32, 32, 3), rgb, np.uint8))


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
        )
        yield launched
        launched.close()


@contextlib.contextmanager
def _page(browser, url, javascript=True):
    """A fresh page at ``url``/, with page.js's sends recorded, and every page error collected."""
    context = browser.new_context(java_script_enabled=javascript, viewport={"width": 900, "height": 800})
    if javascript:
        context.add_init_script(COUNT_SENT)
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.on("console", lambda m: page.errors.append(m.text) if "Content Security Policy" in m.text else None)
    page.goto(f"{url}/")
    try:
        yield page
    finally:
        context.close()
    assert page.errors == []


def _watch_navigation(page):
    """A list that gets each navigation of the page's main frame from now on, and a mark in the page's memory."""
    navigations = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url) if frame == page.main_frame else None)
    page.evaluate("window.__mark = 'the same document'")
    return navigations


def _assert_in_place(page, url, navigations):
    assert navigations == [] and page.url == f"{url}/"
    assert page.evaluate("window.__mark") == "the same document"  # no load: the document is the one we marked


# -- a fake backend whose answers are known -------------------------------------------------------------

CLASSES = ("cat", "deer", "dog")
# By the image's dominant colour: red a confident cat, green "not sure: deer or cat", blue foreign.
ROWS = {0: [0.90, 0.06, 0.04], 1: [0.30, 0.45, 0.25], 2: [0.50, 0.30, 0.20]}


class _KnownBackend:
    kind = "fake"
    loaded = True

    def __init__(self):
        self.fail = None  # a message: every inference is refused with it, as an overloaded model is

    def info(self):
        from serve.core import ModelInfo

        return ModelInfo(name="cifar10", version=1, versions=(1,), class_names=CLASSES)

    def infer(self, images, version=None, deadline=None):
        from serve.core import Prediction
        from serve.core.errors import Unavailable

        if self.fail:
            raise Unavailable(self.fail)
        colour = np.asarray(images, np.float32).mean(axis=(1, 2)).argmax(1)
        rows = np.float32([ROWS[c] for c in colour.tolist()])
        return Prediction(1, {"probabilities": rows, "class_ids": rows.argmax(1),
                              "class_names": np.array([CLASSES[c].encode() for c in rows.argmax(1)], object),
                              "ood_score": np.where(colour == 2, 3.5, -9.0).astype(np.float32), "in_distribution": colour != 2})

    def run(self, signature_name, inputs, version=None):
        raise AssertionError("not called")

    def ready(self):
        return 1

    def close(self):
        pass


@contextlib.contextmanager
def _known_server(**config):
    """The app over :class:`_KnownBackend` on a free loopback port, in this process: (base URL, backend)."""
    from werkzeug.serving import make_server

    from serve import create_app

    backend = _KnownBackend()
    server = make_server("127.0.0.1", 0, create_app({"TESTING": True, **config}, backend=backend), threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", backend
    finally:
        server.shutdown()
        thread.join(30)


@pytest.fixture(scope="module")
def known():
    with _known_server() as served:
        yield served


KNOWN_FILES = [_solid("red.png", (220, 30, 30)), _solid("green.png", (30, 220, 30)), _solid("blue.png", (30, 30, 220))]


def _shown(page):
    """Each result as the page shows it: file name, the verdict's test id and words, and the bars' texts."""
    return page.evaluate("""() => Array.from(document.querySelectorAll('.result')).map((r) => ({
        name: r.querySelector('.filename').textContent,
        verdict: Array.from(r.querySelectorAll('[data-testid]')).map((e) => [e.dataset.testid, e.textContent]),
        bars: Array.from(r.querySelectorAll('.bar')).map((b) => [b.className, Array.from(b.children).map((c) => c.textContent).join(' ')]),
        error: (r.querySelector('.error') || {}).textContent || null,
        image: !!r.querySelector('img')}))""")


# -- the session's server, a real model ---------------------------------------------------------------------


@pytest.mark.end_to_end
def test_dropped_files_show_thumbnails_can_be_removed_and_get_results_in_place(browser, live_server):  # noqa: F811
    files = _synthetic_files(3)
    with _page(browser, live_server) as page:
        assert page.locator("#drop-hint").is_visible()  # the script ran
        assert page.evaluate(DISPATCH, ["drop", files]) is False  # page.js took the drop (preventDefault)
        thumbnails = page.locator("#chosen li img")
        assert thumbnails.count() == 3
        page.wait_for_function("Array.from(document.querySelectorAll('#chosen img')).every((i) => i.naturalWidth === 32)")
        assert thumbnails.first.get_attribute("src").startswith("blob:")  # an object URL, under the page's CSP
        assert page.evaluate("document.getElementById('file').files.length") == 3  # the form could post them too
        page.get_by_role("button", name="Remove upload1.png").click()
        assert page.locator("#chosen li").count() == 2
        assert page.evaluate("Array.from(document.getElementById('file').files).map((f) => f.name)") == ["upload0.png", "upload2.png"]
        navigations = _watch_navigation(page)
        page.click("button[type=submit]")
        page.wait_for_selector(DONE)
        _assert_in_place(page, live_server, navigations)
        shown = _shown(page)
        assert [r["name"] for r in shown] == ["upload0.png", "upload2.png"]
        for result in shown:  # a label, "not sure: A or B", or "none of the three classes", as the model answered
            (testid, words), *_ = result["verdict"]
            assert result["image"] and result["error"] is None
            assert {"label": words in synthetic.CLASS_NAMES, "verdict": words == "none of the three classes",
                    "not-sure": words.startswith("not sure: ")}[testid]
        assert page.locator("#chosen li").count() == 0  # sent: the thumbnails moved into the results
        assert page.inner_text("#status") == "Done: 2 of 2 images classified."
        assert page.evaluate("window.__sent") == [2]


@pytest.mark.end_to_end
def test_a_pasted_image_is_chosen_and_classified(browser, live_server):  # noqa: F811
    with _page(browser, live_server) as page:
        assert page.evaluate(DISPATCH, ["paste", _synthetic_files(1, seed=3)]) is False
        assert page.locator("#chosen li").count() == 1
        assert page.inner_text("#chosen li .name") == "upload0.png"
        navigations = _watch_navigation(page)
        page.click("button[type=submit]")
        page.wait_for_selector(DONE)
        _assert_in_place(page, live_server, navigations)
        assert page.locator(".result").count() == 1
        assert page.evaluate("document.querySelector('.result img').naturalWidth") == 32


@pytest.mark.end_to_end
def test_many_files_go_in_batches_with_progress(browser, live_server, tmp_path):  # noqa: F811
    images, _ = synthetic.make_images(7, seed=5)  # 21 images
    paths = []
    for i, image in enumerate(images[:20]):
        paths.append(tmp_path / f"many{i:02}.png")
        paths[-1].write_bytes(synthetic.encode(image))
    with _page(browser, live_server) as page:
        page.set_input_files("#file", [str(p) for p in paths])  # the file dialog's way in
        assert page.locator("#chosen li").count() == 20
        page.evaluate("""() => {
            window.__progress = []; window.__status = [];
            const progress = document.getElementById('progress'), status = document.getElementById('status');
            new MutationObserver(() => window.__progress.push([progress.value, progress.max])).observe(progress, {attributes: true});
            new MutationObserver(() => window.__status.push(status.textContent)).observe(status, {childList: true});
        }""")
        page.click("button[type=submit]")
        page.wait_for_selector(DONE)
        assert page.evaluate("window.__sent") == [8, 8, 4]  # page.js's batch of 8, within the server's cap of 256
        assert page.locator(".result").count() == 20
        assert page.locator(".result .filename").all_inner_texts() == [p.name for p in paths]  # in order
        values = [value for value, total in page.evaluate("window.__progress") if total == 20]
        assert sorted(set(values)) == [0, 8, 16, 20] and values[-1] == 20
        statuses = page.evaluate("window.__status")
        assert "Classified 8 of 20 images…" in statuses and "Classified 16 of 20 images…" in statuses
        assert statuses[-1] == "Done: 20 of 20 images classified."


@pytest.mark.end_to_end
def test_without_javascript_the_form_posts_and_shows_results(browser, live_server, tmp_path):  # noqa: F811
    paths = []
    for i, image in enumerate(synthetic.make_images(1, seed=4)[0][:2]):
        paths.append(str(tmp_path / f"plain{i}.png"))
        (tmp_path / f"plain{i}.png").write_bytes(synthetic.encode(image))
    with _page(browser, live_server, javascript=False) as page:
        assert not page.locator("#drop-hint").is_visible() and not page.locator("#sending").is_visible()
        page.set_input_files("#file", paths)
        with page.expect_navigation():
            page.click("button[type=submit]")
        assert page.locator(".result").count() == 2
        assert page.locator(".result img").first.get_attribute("src").startswith("data:image/png;base64,")
        assert page.locator(".result .filename").all_inner_texts() == ["plain0.png", "plain1.png"]


@pytest.mark.end_to_end
def test_the_page_has_no_serious_accessibility_violations(browser, live_server, known):  # noqa: F811
    from axe_playwright_python.sync_playwright import Axe

    def serious(page):
        violations = Axe().run(page).response["violations"]
        return [(v["id"], v["impact"], [n["target"] for n in v["nodes"]]) for v in violations if v["impact"] in ("serious", "critical")]

    with _page(browser, live_server) as page:
        assert serious(page) == []  # the empty page
        page.evaluate(DISPATCH, ["drop", _synthetic_files(2)])
        assert serious(page) == []  # with thumbnails and their buttons
        page.click("button[type=submit]")
        page.wait_for_selector(DONE)
        assert serious(page) == []  # with results
    url, _ = known
    with _page(browser, url) as page:  # every kind of answer: a label, "not sure", foreign with greyed guesses, a refusal
        page.evaluate(DISPATCH, ["drop", [*KNOWN_FILES, {"name": "notes.txt", "type": "text/plain", "b64": "bm90IGFuIGltYWdl"}]])
        page.click("button[type=submit]")
        page.wait_for_selector(DONE)
        assert page.locator(".bar.guess").count() and page.locator("[data-testid=not-sure]").count()
        assert serious(page) == []
        page.set_viewport_size({"width": 360, "height": 640})  # a phone: nothing wider than the screen
        assert page.evaluate("document.documentElement.scrollWidth") <= 360
        assert serious(page) == []


@pytest.mark.end_to_end
def test_the_keyboard_reaches_everything_with_a_visible_focus(browser, live_server):  # noqa: F811
    with _page(browser, live_server) as page:
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.id") == "file"  # the drop zone's input comes first
        assert page.evaluate("getComputedStyle(document.activeElement).outlineStyle") == "solid"
        page.evaluate(DISPATCH, ["drop", _synthetic_files(3)])
        page.focus("#file")
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.getAttribute('aria-label')") == "Remove upload0.png"
        page.keyboard.press("Enter")  # removes it, and the focus moves to the next one's button
        assert page.locator("#chosen li .name").all_inner_texts() == ["upload1.png", "upload2.png"]
        assert page.evaluate("document.activeElement.getAttribute('aria-label')") == "Remove upload1.png"
        assert "removed" in page.inner_text("#status")


# -- the known backend: wording, errors, keys, limits ----------------------------------------------------------


def test_the_script_words_answers_as_the_form_does(browser, known):
    """"not sure: deer or cat", a plain label, "none of the three classes" and a refusal: the same on both paths."""
    url, _ = known
    files = [*KNOWN_FILES, {"name": "notes.txt", "type": "text/plain", "b64": "bm90IGFuIGltYWdl"}]
    with _page(browser, url) as page:
        page.evaluate(DISPATCH, ["drop", files])
        navigations = _watch_navigation(page)
        page.click("button[type=submit]")
        page.wait_for_selector(DONE)
        _assert_in_place(page, url, navigations)
        scripted = _shown(page)
        assert page.inner_text("#status") == "Done: 3 of 4 images classified, 1 refused."
    with _page(browser, url, javascript=False) as page:
        page.set_input_files("#file", [{"name": f["name"], "mimeType": f["type"], "buffer": base64.b64decode(f["b64"])} for f in files])
        with page.expect_navigation():
            page.click("button[type=submit]")
        rendered = _shown(page)
    assert scripted == rendered
    red, green, blue, notes = scripted
    assert red["verdict"] == [["label", "cat"]]
    assert green["verdict"] == [["not-sure", "not sure: deer or cat"]]
    assert blue["verdict"][0] == ["verdict", "none of the three classes"] and blue["verdict"][1][0] == "ood-note"
    assert all(cls == "bar guess" for cls, _ in blue["bars"]) and blue["bars"][0][1] == "cat 50.0% 50.0%"
    assert "notes.txt" in notes["error"] and not notes["image"]


def test_an_error_is_shown_in_place_and_the_files_stay_chosen(browser, known):
    url, backend = known
    backend.fail = "this worker queues at most 4 images (SERVE_MAX_QUEUE)"
    try:
        with _page(browser, url) as page:
            page.evaluate(DISPATCH, ["drop", KNOWN_FILES[:2]])
            navigations = _watch_navigation(page)
            page.click("button[type=submit]")
            page.wait_for_selector(DONE)
            _assert_in_place(page, url, navigations)
            error = page.locator("[data-testid=batch-error]")
            assert error.get_attribute("role") == "alert"
            assert error.inner_text() == f"Not classified (red.png, green.png): {backend.fail}"  # the JSON error, as sent
            assert page.inner_text("#status").startswith("Stopped: 0 of 2 images classified.")
            assert page.locator("#chosen li").count() == 2 and page.locator("button[type=submit]").is_enabled()
            backend.fail = None
            page.click("button[type=submit]")  # again, now that the model answers
            page.wait_for_selector(".result")
            page.wait_for_selector(DONE)
            assert page.locator("[data-testid=batch-error]").count() == 0 and page.locator(".result").count() == 2
    finally:
        backend.fail = None


def test_nothing_chosen_is_said_in_place(browser, known):
    url, _ = known
    with _page(browser, url) as page:
        navigations = _watch_navigation(page)
        page.click("button[type=submit]")
        assert page.inner_text("#results [role=alert]") == "Choose one or more image files first."
        _assert_in_place(page, url, navigations)


def test_batches_keep_within_the_servers_image_cap(browser):
    with _known_server(MAX_IMAGES="3") as (url, _):
        with _page(browser, url) as page:
            page.evaluate(DISPATCH, ["drop", [_solid(f"{i}.png", (200, 10 + i, 10)) for i in range(7)]])
            page.click("button[type=submit]")
            page.wait_for_selector(DONE)
            assert page.evaluate("window.__sent") == [3, 3, 1]
            assert page.locator("[data-testid=label]").count() == 7


def test_without_the_apis_key_the_page_posts_the_form_instead(browser):
    """API keys on and the form open to all: the API turns the script away (401), so the form posts the files."""
    with _known_server(API_KEYS="k-" + "0" * 20, FORM_NEEDS_KEY="0") as (url, _):
        with _page(browser, url) as page:
            page.evaluate(DISPATCH, ["drop", KNOWN_FILES[:2]])
            posts = []
            page.on("request", lambda r: posts.append((r.url.removeprefix(url), r.is_navigation_request())) if r.method == "POST" else None)
            with page.expect_navigation():
                page.click("button[type=submit]")
            assert posts == [("/api/v1/predict", False), ("/", True)]  # the API first, then the form itself
            assert [r["verdict"][0][1] for r in _shown(page)] == ["cat", "not sure: deer or cat"]
            assert page.locator(".result img").first.get_attribute("src").startswith("data:image/png;base64,")
