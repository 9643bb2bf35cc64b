"""The console page in a real headless browser (Debian's chromium, driven by Playwright) over
the running mesh: it loads with no request leaving 127.0.0.1, shows every pipeline's steps
as the proxy resolved them, and an uploaded digit and text page show their answers as the
REST API gives them; behind the API key, the browser gets in with the key as password."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.async_api import Browser, BrowserContext, Page, async_playwright, expect
from playwright.async_api import Error as PlaywrightError

from samples import digits, text
from tests.e2e.conftest import Mesh
from tests.e2e.test_digits import held_out
from tests.report import report

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Chromium's own background traffic (updates, sync, safe browsing) off: nothing may leave.
FLAGS = [
    "--no-sandbox",  # CI runs as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
KEYED_PORT = 20790


def _chromium_or_skip() -> None:
    """In CI the browser test must run (`./mesh test` installs Debian's chromium as root);
    elsewhere, without it, it is skipped."""
    if not os.path.exists(CHROMIUM):
        message = "chromium is missing (./mesh test installs it when run as root)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser test: {message}")
        pytest.skip(message)


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    _chromium_or_skip()
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield browser
        await browser.close()


class Watched:
    """A browser context whose every request is recorded, and refused unless it is for
    127.0.0.1 (or the page's own data: and blob: URLs)."""

    def __init__(self, context: BrowserContext) -> None:
        self.context = context
        self.urls: list[str] = []
        self.outside: list[str] = []
        self.errors: list[str] = []
        """The pages' uncaught exceptions and the browser's refusals (CSP, mixed content)."""

    async def route(self, route, request) -> None:
        self.urls.append(request.url)
        scheme, host = urlsplit(request.url).scheme, urlsplit(request.url).hostname
        if scheme in ("data", "blob") or host == "127.0.0.1":
            await route.continue_()
        else:
            self.outside.append(request.url)
            await route.abort()

    @classmethod
    async def open(cls, browser: Browser, **options) -> Watched:
        context = await browser.new_context(viewport={"width": 1280, "height": 1400}, **options)
        watched = cls(context)
        await context.route("**/*", watched.route)
        return watched


async def _console(watched: Watched, url: str) -> Page:
    page = await watched.context.new_page()
    errors = watched.errors
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    # A failed fetch is logged too ("Failed to load resource": the 415 the test provokes).
    page.on(
        "console",
        lambda m: (
            m.type == "error" and "Failed to load resource" not in m.text and errors.append(m.text)
        ),
    )
    await page.goto(f"{url}/console/")
    await page.wait_for_selector("body[data-ready=true]", timeout=20_000)
    assert errors == [], errors
    return page


async def _send(page: Page, pipeline: str, name: str, blob: bytes, mime: str) -> None:
    await page.select_option("#try-pipeline", pipeline)
    await page.set_input_files(
        "#try-file", files=[{"name": name, "mimeType": mime, "buffer": blob}]
    )
    await page.click("#try-send")


async def test_the_console_shows_the_mesh_and_answers_uploads(
    mesh: Mesh, browser: Browser, tmp_path: Path
) -> None:
    watched = await Watched.open(browser)
    page = await _console(watched, mesh.url)
    rest = httpx.AsyncClient(base_url=mesh.url, timeout=60)
    listed = (await rest.get("/v1/pipelines")).json()

    # Every pipeline, each call step and branch the proxy resolved, with its model.
    for name, about in listed.items():
        card = page.locator(f'[data-pipeline="{name}"]')
        for label, target in about["targets"].items():
            node = card.locator(f'[data-step="{label}"]')
            assert await node.count() == 1, (name, label)
            assert target["model"] in await node.inner_text()

    # A digit: the label and ten probabilities, as /v1 answers them.
    images, labels = held_out()
    sample = digits.suite(images, labels, 1, seed=3)[0]
    classified = await rest.post(
        "/v1/pipelines/digits/infer", content=sample.image, headers={"Content-Type": "image/png"}
    )
    expected = classified.json()["result"]
    await _send(page, "digits", "digit.png", sample.image, "image/png")
    await page.wait_for_selector("#answer-label", timeout=20_000)
    assert await page.inner_text("#answer-label") == str(expected["label"])
    values = await page.locator("#answer-probabilities .value").all_inner_texts()
    assert [float(v) for v in values] == [round(p, 3) for p in expected["probabilities"]]
    assert await page.locator("#try-answer .waterfall .span").count() >= 3  # request + steps
    await page.screenshot(path=tmp_path / "digits.png", full_page=True)

    # A page of text: its lines listed and drawn on the image.
    page_sample = text.suite(1, seed=5, categories=["line_large"])[0]
    read = await rest.post("/v1/pipelines/ocr/infer", files={"file": ("t.png", page_sample.image)})
    truth = read.json()["result"]["lines"]
    await rest.aclose()
    assert truth, "the text image read nothing over REST"
    await _send(page, "ocr", "text.png", page_sample.image, "image/png")
    await page.wait_for_selector("#answer-lines", timeout=30_000)
    shown = await page.locator("#answer-lines tr td:first-child").all_inner_texts()
    assert shown == [line["text"] for line in truth]
    # The boxes are drawn: the canvas holds pixels of the lines' boxes' colour (blue) and
    # of the words' (orange).
    drawn = await page.evaluate(
        """() => {
          const c = document.getElementById('answer-canvas');
          const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
          let lines = 0, words = 0;
          for (let i = 0; i < d.length; i += 4) {
            if (d[i + 2] > 150 && d[i] < 80) lines++;
            if (d[i] > 180 && d[i + 1] > 70 && d[i + 1] < 150 && d[i + 2] < 80) words++;
          }
          return [lines, words];
        }"""
    )
    assert drawn[0] > 100 and drawn[1] > 50, drawn
    assert sum(len(line["words"]) for line in truth) >= 2
    await page.screenshot(path=tmp_path / "ocr.png", full_page=True)

    # Not an image: the proxy's error, named, where the answer would be.
    await _send(page, "digits", "notes.txt", b"just some text", "text/plain")
    await page.wait_for_selector("#try-status.error", timeout=10_000)
    assert (await page.inner_text("#try-status")).startswith("415: ")

    # The uploads are among the last requests, and the live figures have filled in.
    # Waited for by locators (polled by Playwright), not page functions: the page's policy
    # refuses the eval those need.
    await page.locator("#recent tbody tr[data-id]").nth(2).wait_for(timeout=10_000)
    rows = await page.locator("#recent tbody tr td:nth-child(2)").all_inner_texts()
    assert {"digits", "ocr"} <= set(rows)
    live = page.locator('[data-live="ocr|(request)"]')
    await expect(live).to_contain_text("p50", timeout=10_000)
    assert "p99" in await live.inner_text()
    await page.screenshot(path=tmp_path / "console.png", full_page=True)
    report(f"console page: screenshots in {tmp_path}; {len(watched.urls)} requests, all local")
    assert watched.outside == []
    assert all(urlsplit(u).hostname == "127.0.0.1" for u in watched.urls if "://" in u)
    assert watched.errors == []  # nothing the page does is refused by its own policy
    await watched.context.close()


async def test_behind_the_api_key_the_browser_is_asked_for_it(mesh: Mesh, browser: Browser) -> None:
    with mesh.extra_proxy(KEYED_PORT, wait_for="/healthz", PROXY_API_KEY="s3cret") as url:
        # Without the key the browser has nothing to answer the challenge with (headless,
        # nobody to ask) and gives up; with a wrong one it is answered 401: no page either way.
        stranger = await Watched.open(browser)
        page = await stranger.context.new_page()
        with pytest.raises(PlaywrightError, match="ERR_INVALID_AUTH_CREDENTIALS"):
            await page.goto(f"{url}/console/")
        await stranger.context.close()
        wrong = await Watched.open(browser, http_credentials={"username": "me", "password": "s3"})
        page = await wrong.context.new_page()
        refused = await page.goto(f"{url}/console/")
        assert refused is not None and refused.status == 401
        assert "API key" in await page.inner_text("body")
        await wrong.context.close()

        keyed = await Watched.open(
            browser, http_credentials={"username": "me", "password": "s3cret"}
        )
        page = await _console(keyed, url)
        # The page's own calls (pipelines, feeds) went through with the key.
        async with httpx.AsyncClient(headers={"X-API-Key": "s3cret"}) as rest:
            listed = (await rest.get(f"{url}/v1/pipelines")).json()
        assert await page.locator("[data-pipeline]").count() == len(listed)
        assert keyed.outside == []
        await keyed.context.close()
