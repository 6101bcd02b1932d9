"""The console in a real headless browser (Chromium through selenium): each page
over a store filled by a real run, a click from the list to an instance, one action
with the token (given to the console in its environment), and the refusals of a
wrong token and of a cross-site form (nothing stored). Screenshots go to
``PHRONOMY_CONSOLE_SCREENSHOTS`` or the test's temporary directory; the docs' ones
are refreshed with ``PHRONOMY_CONSOLE_SCREENSHOTS=docs/_static/console
PHRONOMY_REQUIRE_BROWSER=1 python -m pytest tests/console/test_browser.py``.

Without Chromium and its driver these tests skip, or fail where the browser is
required (``PHRONOMY_REQUIRE_BROWSER=1``, set by CI's ``.ci/run``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest
import trio

import phronomy
from console.filling import HOSTILE_ID, expenses, fill
from phronomy.console import ConsoleApp, serve_console
from phronomy.storage import InboxOp

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

pytestmark = pytest.mark.slow

TOKEN = "browser-token-1"
ROOT = Path(__file__).parents[2]
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1200,1000",
]


def _missing(reason: str) -> NoReturn:
    if os.environ.get("PHRONOMY_REQUIRE_BROWSER"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A headless Chromium (a fresh profile), driven by selenium (one per module)."""
    tmp_path = tmp_path_factory.mktemp("chromium")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        _missing(
            "no chromium and chromium-driver (apt-get install chromium chromium-driver)"
        )
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _missing("selenium is not installed")
    options = webdriver.ChromeOptions()
    options.binary_location = str(chromium)
    for flag in [*FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(str(driver_path)))
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def console(filled_db: Path) -> Iterator[str]:
    """``python -m phronomy console`` with actions, on a free port: its URL. The
    token is given in the environment (off the command line)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "src"), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]
        ),
        "PHRONOMY_CONSOLE_TOKEN": TOKEN,
    }
    argv = [sys.executable, "-m", "phronomy", "console", "--db", str(filled_db)]
    argv += ["--port", "0", "--app", "console.filling:expenses", "--allow-actions"]
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if "http://" not in line:
            process.kill()
            raise AssertionError(f"no console: {line!r} {process.communicate()}")
        yield line.split(" on ")[1].split()[0]
    finally:
        process.terminate()  # SIGTERM: it stops serving and closes the store
        _, errors = process.communicate(timeout=10)
    assert process.returncode == 0, errors


def _shots(tmp_path: Path) -> Path:
    where = Path(os.environ.get("PHRONOMY_CONSOLE_SCREENSHOTS") or tmp_path / "shots")
    where.mkdir(parents=True, exist_ok=True)
    return where


def _pending(db: Path, iid: str) -> list[tuple[str, Any]]:
    with phronomy.SQLiteStore(db, read_only=True) as store:
        entries = store.run(InboxOp(workflow_instance_id=iid, limit=100))
    return [(e.event, json.loads(e.payload)) for e in entries]


def test_the_console_in_a_browser(
    browser: Any, console: str, filled_db: Path, tmp_path: Path
) -> None:
    from selenium.common.exceptions import (
        StaleElementReferenceException,
        WebDriverException,
    )
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.wait import WebDriverWait

    def click(element: Any) -> None:
        """Click *element* and wait for the page it leads to."""
        page = browser.find_element(By.TAG_NAME, "html")
        element.click()

        def left(_: Any) -> bool:
            try:
                page.is_enabled()
            except StaleElementReferenceException:
                return True
            except WebDriverException as exc:  # mid-navigation, Chrome may say so
                if "does not belong to the document" not in str(exc):
                    raise
                return True
            return False

        WebDriverWait(browser, 10).until(left)

    shots = _shots(tmp_path)
    browser.get(f"{console}/instances")
    assert browser.title == "Instances · phronomy console"
    ids = [
        a.text
        for a in browser.find_elements(
            By.CSS_SELECTOR, "table.instances td:first-child a"
        )
    ]
    assert ids == [HOSTILE_ID, "exp-1", "exp-2", "exp-3"]
    counts = browser.find_element(By.CSS_SELECTOR, "p.counts").text
    assert "total 4" in counts
    assert "halted: 3" in counts
    assert browser.find_elements(By.TAG_NAME, "script") == []  # the id stayed text
    browser.save_screenshot(str(shots / "instances.png"))

    click(browser.find_element(By.LINK_TEXT, "exp-1"))
    assert browser.find_element(By.TAG_NAME, "h1").text == "Instance exp-1"
    current = browser.find_element(By.CSS_SELECTOR, "svg g.current")
    assert current.get_attribute("data-state") == "awaiting_manager"
    timers = browser.find_element(By.CSS_SELECTOR, "table.timers").text
    assert "after 2d (awaiting_manager)" in timers
    browser.save_screenshot(str(shots / "instance.png"))

    def send(token: str) -> str:
        form = browser.find_element(By.CSS_SELECTOR, "form[action='/instance/send']")
        form.find_element(By.NAME, "payload").send_keys('"bob"')
        form.find_element(By.NAME, "token").send_keys(token)
        click(form.find_element(By.TAG_NAME, "button"))
        text: str = browser.find_element(By.TAG_NAME, "main").text
        return text

    assert "wrong token" in send("not-the-token")
    assert _pending(filled_db, "exp-1") == []
    browser.get(f"{console}/instance?id=exp-1")
    assert "event 'approve' stored as seq 1" in send(TOKEN)
    assert _pending(filled_db, "exp-1") == [("approve", "bob")]
    browser.save_screenshot(str(shots / "action.png"))

    # a page of another origin posting a form to the console, token included
    attack = tmp_path / "attack.html"
    attack.write_text(
        f'<form method="post" action="{console}/instance/send">'
        '<input name="id" value="exp-3"><input name="event" value="approve">'
        f'<input name="token" value="{TOKEN}"><button id="go">go</button></form>'
    )
    browser.get(attack.as_uri())
    click(browser.find_element(By.ID, "go"))
    assert (
        "cross-site request refused" in browser.find_element(By.TAG_NAME, "main").text
    )
    assert _pending(filled_db, "exp-3") == []

    browser.get(f"{console}/executions")
    click(browser.find_element(By.LINK_TEXT, "assistant-1"))
    assert "Send these results?" in browser.find_element(By.TAG_NAME, "main").text
    browser.save_screenshot(str(shots / "execution.png"))
    browser.get(f"{console}/schedules")
    assert "nightly" in browser.find_element(By.CSS_SELECTOR, "table.schedules").text
    browser.save_screenshot(str(shots / "schedules.png"))
    for name in ("instances", "instance", "action", "execution", "schedules"):
        assert (shots / f"{name}.png").stat().st_size > 1000


async def test_a_page_on_postgresql(
    browser: Any, open_postgres: Callable[..., phronomy.PostgresStore], tmp_path: Path
) -> None:
    """The console served in this process (hypercorn on this trio run) over a
    PostgreSQL store filled by a real run."""
    from selenium.webdriver.common.by import By

    store = open_postgres()
    await fill(store)
    app = ConsoleApp(store, definitions=[expenses()])
    shots = tmp_path  # not among the docs' screenshots

    def look(url: str) -> tuple[str, str | None, str]:
        browser.get(f"{url}/instance?id=exp-1")
        current = browser.find_element(By.CSS_SELECTOR, "svg g.current")
        browser.save_screenshot(str(shots / "postgresql.png"))
        return (
            browser.find_element(By.TAG_NAME, "h1").text,
            current.get_attribute("data-state"),
            browser.find_element(By.CSS_SELECTOR, "span.mode").text,
        )

    async with trio.open_nursery() as nursery:
        [url] = await nursery.start(lambda task_status: serve_console(
            app, port=0, task_status=task_status
        ))  # fmt: skip
        seen = await trio.to_thread.run_sync(look, url)
        nursery.cancel_scope.cancel()
    assert seen == ("Instance exp-1", "awaiting_manager", "read-only")
