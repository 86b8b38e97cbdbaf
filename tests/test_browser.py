"""The upload form in real headless Chromium: choose a file, submit, see the label."""

import os
import pathlib

import pytest

import synthetic
from live_server import live_server  # noqa: F401  (imported for its fixture)

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = pathlib.Path(__file__).resolve().parent.parent / "test-artifacts"

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed (apt-get install chromium)"
)


def test_form_in_chromium(live_server, tmp_path):  # noqa: F811
    from playwright.sync_api import sync_playwright

    images, labels = synthetic.make_images(1, seed=9)
    paths = []
    for i, image in enumerate(images):
        path = tmp_path / f"sample{i}.png"
        path.write_bytes(synthetic.encode(image))
        paths.append(str(path))
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
        )
        try:
            page = browser.new_page()
            page.goto(f"{live_server}/")
            page.set_input_files("input[type=file]", paths)
            page.click("button[type=submit]")
            page.wait_for_selector("[data-testid=label]")
            shown = page.locator("[data-testid=label]").all_inner_texts()
            assert len(shown) == len(paths)
            assert all(label in synthetic.CLASS_NAMES for label in shown)
            assert sum(label == synthetic.CLASS_NAMES[y] for label, y in zip(shown, labels)) >= 2
            images_on_page = page.locator(".result img")
            assert images_on_page.count() == len(paths)
            assert images_on_page.first.get_attribute("src").startswith("data:image/png;base64,")
            assert page.evaluate("document.querySelector('.result img').naturalWidth") == 32  # it really renders
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "form.png"), full_page=True)
        finally:
            browser.close()


def test_form_without_javascript(live_server, tmp_path):  # noqa: F811
    from playwright.sync_api import sync_playwright

    path = tmp_path / "notes.txt"
    path.write_bytes(b"not an image")
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
        )
        try:
            page = browser.new_context(java_script_enabled=False).new_page()
            page.goto(f"{live_server}/")
            page.set_input_files("input[type=file]", str(path))
            page.click("button[type=submit]")
            page.wait_for_selector("[role=alert]")
            assert "not an image" in page.locator("[role=alert]").first.inner_text()
        finally:
            browser.close()
