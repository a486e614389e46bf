"""`agentrl view`: the JSON API, live updates, and the page driven in a real headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.error import HTTPError
from urllib.request import urlopen

import pytest
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.recording import Recording, RecordWriter
from agentrl.viewer import Catalog, ViewerServer

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
REQUIRE_BROWSER = os.environ.get("AGENTRL_REQUIRE_BROWSER") == "1"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store written by the real CLI: random play with a short turn limit ends both ways."""
    store = tmp_path_factory.mktemp("rollout") / "store"
    args = ["rollout", "games/GuessNumber-v0", "-n", "24", "--max-turns", "3", "--record", str(store)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return store


@pytest.fixture
def viewer(recorded: Path) -> Iterator[ViewerServer]:
    with ViewerServer(Catalog(recorded)) as server:
        yield server


def get(server: ViewerServer, path: str) -> tuple[int, object]:
    try:
        with urlopen(server.url + path, timeout=10) as response:
            return response.status, json.loads(response.read())
    except HTTPError as error:
        return error.code, json.loads(error.read())


def test_rollout_record_writes_every_kept_episode(recorded: Path) -> None:
    summaries = Recording(recorded).summaries
    assert len(summaries) == 24
    assert {s["source"] for s in summaries} == {"rollout"} and {s["policy"] for s in summaries} == {"random"}
    assert set(Counter(s["stop_reason"] for s in summaries)) == {"terminated", "truncated"}


def test_api_filters_episodes(viewer: ViewerServer, recorded: Path) -> None:
    summaries = Recording(recorded).summaries
    status, body = get(viewer, "/api/episodes?run=.&stop_reason=truncated")
    assert status == 200
    truncated = [s for s in summaries if s["stop_reason"] == "truncated"]
    assert body["total"] == len(truncated)
    assert {e["key"] for e in body["episodes"]} == {s["key"] for s in truncated}
    status, body = get(viewer, "/api/episodes?run=.&success=true&min_reward=0.5")
    assert body["total"] == sum(s["success"] and s["reward"] >= 0.5 for s in summaries)
    status, body = get(viewer, f"/api/episodes?run=.&seed={summaries[3]['seed']}")
    assert [e["key"] for e in body["episodes"]] == [summaries[3]["key"]]


def test_api_episode_has_turns_rewards_and_observations(viewer: ViewerServer, recorded: Path) -> None:
    record = next(Recording(recorded).episodes())
    status, body = get(viewer, f"/api/episode?run=.&key={record.key}")
    assert status == 200
    assert [t["reward"] for t in body["turns"]] == [t.reward for t in record.trajectory.turns]
    assert [t["observation"] for t in body["turns"]] == [t.observation for t in record.trajectory.turns]


@pytest.mark.parametrize(
    ("path", "status", "message"),
    [
        ("/api/episodes?run=nope", 404, "no run named 'nope'"),
        ("/api/episodes", 400, "run parameter is required"),
        ("/api/episodes?run=.&step=two", 400, "step must be an integer"),
        ("/api/episodes?run=.&success=maybe", 400, "success must be true or false"),
        ("/api/episode?run=.&key=missing", 404, "no episode 'missing'"),
        ("/api/nothing", 404, "no API route"),
        ("/static/../recording.py", 404, "no page"),
    ],
)
def test_bad_requests_get_a_clear_4xx(viewer: ViewerServer, path: str, status: int, message: str) -> None:
    code, body = get(viewer, path)
    assert code == status and message in body["error"]


def test_page_assets_are_served_from_the_package_with_no_external_links(viewer: ViewerServer) -> None:
    for name in ("/", "/static/app.js", "/static/style.css"):
        with urlopen(viewer.url + name, timeout=10) as response:
            text = response.read().decode()
        # the only absolute URL is the SVG namespace, an identifier that is never fetched
        assert text.replace("http://www.w3.org/2000/svg", "").count("http") == 0, name


def test_episodes_written_while_serving_appear_on_the_next_request(tmp_path: Path) -> None:
    from recording_helpers import make_trajectory

    writer = RecordWriter(tmp_path, "live")
    writer.write_episode(make_trajectory(0))
    with ViewerServer(Catalog(tmp_path)) as server:
        assert get(server, "/api/episodes?run=.")[1]["total"] == 1
        writer.write_episode(make_trajectory(1))
        writer.write_episode(make_trajectory(2))
        assert get(server, "/api/episodes?run=.")[1]["total"] == 3
    writer.close()


def test_a_directory_of_runs_lists_each_run(tmp_path: Path) -> None:
    from recording_helpers import make_trajectory

    for name in ("a", "b"):
        with RecordWriter(tmp_path / name / "recording", "train") as writer:
            writer.write_episode(make_trajectory(0))
    with ViewerServer(Catalog(tmp_path)) as server:
        assert sorted(r["name"] for r in get(server, "/api/runs")[1]) == ["a", "b"]


# -- the page in a real browser ------------------------------------------------------------------


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[object]:
    if not (CHROMIUM and CHROMEDRIVER):
        if REQUIRE_BROWSER:
            pytest.fail("chromium/chromedriver missing: run scripts/setup_browser.sh")
        pytest.skip("chromium and chromedriver are not installed (scripts/setup_browser.sh)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--window-size=1500,950",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def test_viewer_in_headless_chromium_lists_filters_and_shows_an_episode(
    browser: object, viewer: ViewerServer, recorded: Path, tmp_path: Path
) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    driver = browser
    summaries = Recording(recorded).summaries
    # The page redraws the list as answers arrive; an element read mid-redraw is simply read again.
    wait = WebDriverWait(driver, 20, ignored_exceptions=[StaleElementReferenceException])
    driver.get(viewer.url)

    def rows() -> list:
        return driver.find_elements(By.CSS_SELECTOR, "#episode-table tbody tr")

    # The list loads every recorded episode.
    wait.until(lambda _: len(rows()) == len(summaries))
    assert f"{len(summaries)} episodes" in driver.find_element(By.ID, "list-count").text

    # Filtering by stop reason keeps exactly the truncated ones.
    truncated = {s["key"] for s in summaries if s["stop_reason"] == "truncated"}
    Select(driver.find_element(By.ID, "filter-stop")).select_by_value("truncated")
    wait.until(lambda _: {r.get_attribute("data-key") for r in rows()} == truncated)
    assert {r.find_elements(By.TAG_NAME, "td")[3].text for r in rows()} == {"truncated"}

    # One episode: its turns and their rewards render.
    row = rows()[0]
    record = Recording(recorded).episode(row.get_attribute("data-key"))
    row.click()
    turns = record.trajectory.turns
    wait.until(lambda _: len(driver.find_elements(By.CSS_SELECTOR, "#episode-detail .turn")) == len(turns))
    rewards = driver.find_elements(By.CSS_SELECTOR, "#episode-detail .turn-reward")
    assert [float(e.get_attribute("data-reward")) for e in rewards] == [t.reward for t in turns]
    assert all(e.text.startswith("reward ") for e in rewards)
    observations = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#episode-detail .turn")]
    assert all(t.observation.splitlines()[0] in o for t, o in zip(turns, observations, strict=True))
    assert driver.find_element(By.ID, "status").text == ""  # no API error surfaced on the page

    shot = tmp_path / "viewer.png"
    assert driver.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def test_view_command_names_a_directory_without_recordings(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["view", str(tmp_path)])
    assert result.exit_code == 2
    assert "holds no recorded run" in result.output


def test_page_shows_episodes_recorded_after_it_loaded(browser: object, tmp_path: Path) -> None:
    from recording_helpers import make_trajectory
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = browser
    writer = RecordWriter(tmp_path / "store", "live")
    writer.write_episode(make_trajectory(0))
    with ViewerServer(Catalog(tmp_path / "store")) as server:
        driver.get(server.url)
        wait = WebDriverWait(driver, 20)
        wait.until(lambda _: driver.find_element(By.ID, "list-count").text == "1 episodes")
        writer.write_episode(make_trajectory(1))  # the run goes on; the page's poll picks it up
        wait.until(lambda _: driver.find_element(By.ID, "list-count").text == "2 episodes")
    writer.close()


def test_episodes_a_resume_superseded_are_listed_only_when_asked_for(tmp_path: Path) -> None:
    from recording_helpers import make_trajectory

    with RecordWriter(tmp_path, "train") as writer:
        for seed in (1, 2):
            writer.write_episode(make_trajectory(seed), step=2)
        writer.write_resume(1)
        writer.write_episode(make_trajectory(3), step=2)
    with ViewerServer(Catalog(tmp_path)) as server:
        listed = get(server, "/api/episodes?run=.")[1]
        assert [e["seed"] for e in listed["episodes"]] == [3]
        only_superseded = get(server, "/api/episodes?run=.&superseded=true")[1]
        assert [e["seed"] for e in only_superseded["episodes"]] == [2, 1]
        assert get(server, "/api/episodes?run=.&superseded=any")[1]["total"] == 3
        runs = get(server, "/api/runs")[1]
        status, body = get(server, "/api/episodes?run=.&superseded=maybe")
        assert status == 400 and "superseded must be true, false or any" in json.dumps(body)
    assert [(r["episodes"], r["superseded"]) for r in runs] == [(1, 2)]  # type: ignore[index, union-attr]
