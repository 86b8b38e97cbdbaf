"""The upload form in real headless Chromium: choose a file, submit, see the label; with JavaScript (the
results in place, from page.js) and without (the results page from the server). The page's script
alone is tested in tests/serve/test_page.py."""

import os
import pathlib

import pytest

import synthetic
from live_server import live_server  # noqa: F401  (imported for its fixture)

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = pathlib.Path(__file__).resolve().parents[2] / "test-artifacts"

pytestmark = [pytest.mark.end_to_end, pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed (apt-get install chromium)"
)]


def _write_pngs(folder, images):
    """Each uint8 image as ``folder/uploadN.png``; their paths, in order."""
    paths = []
    for i, image in enumerate(images):
        path = folder / f"upload{i}.png"
        path.write_bytes(synthetic.encode(image))
        paths.append(str(path))
    return paths


def _chromium(playwright):
    return playwright.chromium.launch(
        executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
    )


def _submitted(browser, url, paths, javascript):
    """A page after choosing ``paths`` on the form at ``url`` and submitting it, once the results show."""
    page = browser.new_context(java_script_enabled=javascript).new_page()
    page.goto(f"{url}/")
    page.set_input_files("input[type=file]", paths)
    page.click("button[type=submit]")
    # page.js marks the end of its batches; without it, the results page has loaded once a result shows.
    page.wait_for_selector("#results[aria-busy=false]" if javascript else ".result")
    return page


WITH_AND_WITHOUT_JAVASCRIPT = pytest.mark.parametrize("javascript", [True, False], ids=["javascript", "no-javascript"])


@WITH_AND_WITHOUT_JAVASCRIPT
def test_form_in_chromium(live_server, tmp_path, javascript):  # noqa: F811
    from playwright.sync_api import sync_playwright

    images, labels = synthetic.make_images(1, seed=9)
    paths = _write_pngs(tmp_path, images)
    with sync_playwright() as p:
        browser = _chromium(p)
        try:
            page = _submitted(browser, live_server, paths, javascript)
            results = page.locator(".result")
            assert results.count() == len(paths)
            # Each result shows its label, or "none of the three classes" when the image looks foreign
            # (about one in twenty of the training set's kind, by export's threshold); the best guess
            # heads the bars either way.
            for i in range(len(paths)):
                shown = results.nth(i).locator("[data-testid=label], [data-testid=verdict]").all_inner_texts()
                assert len(shown) == 1 and (shown[0] in synthetic.CLASS_NAMES or shown[0] == "none of the three classes")
            best = [results.nth(i).locator(".bar .name").first.inner_text() for i in range(len(paths))]
            assert all(label in synthetic.CLASS_NAMES for label in best)
            assert sum(label == synthetic.CLASS_NAMES[y] for label, y in zip(best, labels)) >= 2
            images_on_page = page.locator(".result img")
            assert images_on_page.count() == len(paths)
            # The upload itself: the thumbnail's object URL in place, or a data: URL on the results page.
            assert images_on_page.first.get_attribute("src").startswith("blob:" if javascript else "data:image/png;base64,")
            assert page.evaluate("document.querySelector('.result img').naturalWidth") == 32  # it really renders
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / f"form-{'js' if javascript else 'nojs'}.png"), full_page=True)
        finally:
            browser.close()


@WITH_AND_WITHOUT_JAVASCRIPT
def test_form_says_none_of_the_classes_for_a_foreign_image(live_server, tmp_path, javascript):  # noqa: F811
    """A flat dark grey square and dark pixel noise look like no class: the page says so, with the guesses greyed."""
    import numpy as np
    from playwright.sync_api import sync_playwright

    # As tests/export/test_confidence.py's: within the training images' brightness (see why there).
    noise = np.clip(np.random.default_rng(4).normal(60, 12, (32, 32, 3)), 0, 255).astype(np.uint8)
    foreign = [np.full((32, 32, 3), 60, np.uint8), noise]  # darker than any class (mid-grey is near the threshold)
    own = synthetic.make_images(1, seed=9)[0][:1]
    paths = _write_pngs(tmp_path, [*foreign, *own])
    with sync_playwright() as p:
        browser = _chromium(p)
        try:
            page = _submitted(browser, live_server, paths, javascript)
            results = page.locator(".result")
            assert results.count() == 3
            for i in range(2):  # the foreign ones: the verdict, a note, the guesses greyed
                result = results.nth(i)
                assert result.locator("[data-testid=verdict]").inner_text() == "none of the three classes"
                assert result.locator("[data-testid=label]").count() == 0
                assert "closest guesses" in result.locator("[data-testid=ood-note]").inner_text()
                guesses = result.locator(".bar.guess")
                assert guesses.count() >= 1
                # Greyed: the bar faded, the words grey yet readable (axe's contrast check is in test_page.py).
                assert float(guesses.first.locator(".fill").evaluate("e => getComputedStyle(e).opacity")) < 1
                assert guesses.first.evaluate("e => getComputedStyle(e).color") != page.evaluate("getComputedStyle(document.body).color")
                assert guesses.first.locator(".name").inner_text() in synthetic.CLASS_NAMES
            own_result = results.nth(2)  # one of the training set's kind: a plain label, full strength
            assert own_result.locator("[data-testid=label]").inner_text() in synthetic.CLASS_NAMES
            assert own_result.locator(".bar.guess").count() == 0
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / f"form-foreign-{'js' if javascript else 'nojs'}.png"), full_page=True)
        finally:
            browser.close()


def test_form_without_javascript(live_server, tmp_path):  # noqa: F811
    from playwright.sync_api import sync_playwright

    path = tmp_path / "notes.txt"
    path.write_bytes(b"not an image")
    with sync_playwright() as p:
        browser = _chromium(p)
        try:
            page = browser.new_context(java_script_enabled=False).new_page()
            page.goto(f"{live_server}/")
            page.set_input_files("input[type=file]", str(path))
            page.click("button[type=submit]")
            page.wait_for_selector("[role=alert]")
            assert "not an image" in page.locator("[role=alert]").first.inner_text()
        finally:
            browser.close()
