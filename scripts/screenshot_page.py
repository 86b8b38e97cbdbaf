"""Take the upload page's screenshot for the README: a live server, images dropped, the results in place.

Typical usage (the README's docs/images/page.png)::

    python scripts/screenshot_page.py --model-dir models/cifar10 \\
        --samples runs/airbench_fast-h5000-png-s0/samples.npz --indices 398,168,200,3

It starts ``python -m serve`` on a free loopback port, chooses the images in Chromium through the
page's own file input (so the page's script sends them and shows the results without a reload),
and writes a palette PNG of the page. Needs Chromium (``--chromium``, Debian's by default) and
Playwright's Python package.
"""

import argparse
import io
import os
import socket
import subprocess
import sys
import time
import urllib.request

DEFAULT_OUT = "docs/images/page.png"
DEFAULT_CHROMIUM = "/usr/bin/chromium"
DEFAULT_WIDTH = 720  # CSS pixels: the page's column with a little margin
DEFAULT_COLOURS = 128  # the palette of the written PNG: the README's image stays small
STARTUP_TIMEOUT_S = 120


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(url, process):
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited with code {process.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=10) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass  # not listening yet, or still loading the model
        time.sleep(0.5)
    raise SystemExit(f"the server was not ready within {STARTUP_TIMEOUT_S} s")


def _sample_files(samples, indices):
    """Playwright file payloads of the test images ``indices`` of a run's ``samples.npz``."""
    import numpy as np
    from PIL import Image

    images = np.load(samples)["test_images"]
    files = []
    for index in indices:
        out = io.BytesIO()
        Image.fromarray(images[index]).save(out, "PNG")
        files.append({"name": f"test-{index:04}.png", "mimeType": "image/png", "buffer": out.getvalue()})
    return files


def shoot(url, files, out, chromium, width, colours):
    """Choose ``files`` on the page at ``url``, classify them in place, and write the page to ``out``."""
    from PIL import Image
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": width, "height": 600})
            page.goto(f"{url}/")
            page.set_input_files("input[type=file]", files)
            page.click("button[type=submit]")
            page.wait_for_selector("#results[aria-busy=false]")
            png = page.screenshot(full_page=True)
        finally:
            browser.close()
    image = Image.open(io.BytesIO(png)).convert("RGB").quantize(colours, dither=Image.Dither.NONE)
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    image.save(out, optimize=True)
    return os.path.getsize(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", required=True, help="the served model's folder, as python -m serve takes it (models/NAME)")
    parser.add_argument("--samples", help="a training run's samples.npz, whose test images --indices chooses")
    parser.add_argument("--indices", default="0,1,2,3", help="comma-separated indices into the samples' test images")
    parser.add_argument("images", nargs="*", help="image files to classify (instead of, or besides, --samples)")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"the PNG to write (default {DEFAULT_OUT})")
    parser.add_argument("--chromium", default=DEFAULT_CHROMIUM, help=f"the Chromium to drive (default {DEFAULT_CHROMIUM})")
    parser.add_argument("--width", type=int, default=DEFAULT_WIDTH, help=f"viewport width in CSS pixels (default {DEFAULT_WIDTH})")
    parser.add_argument("--colours", type=int, default=DEFAULT_COLOURS, help=f"palette size of the PNG (default {DEFAULT_COLOURS})")
    args = parser.parse_args(argv)
    files = list(args.images)
    if args.samples:
        files += _sample_files(args.samples, [int(i) for i in args.indices.split(",") if i.strip()])
    if not files:
        parser.error("give image files, or --samples with --indices")

    port = _free_port()
    env = {**os.environ, "GRPC_PORT": "0", "TF_CPP_MIN_LOG_LEVEL": "2"}
    process = subprocess.Popen([sys.executable, "-m", "serve", "--model-dir", args.model_dir, "--host", "127.0.0.1",
                                "--port", str(port)], env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url, process)
        size = shoot(url, files, args.out, args.chromium, args.width, args.colours)
    finally:
        process.terminate()
        process.wait(30)
    print(f"{args.out}: {size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
