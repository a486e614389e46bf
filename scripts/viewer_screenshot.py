"""Write a screenshot of `agentrl view` on a run: the first training episode with tokens, beside
the same seed's episode from another evaluation when one exists. Made docs/viewer.png:

    agentrl train examples/... --out RUN      (any run with recording on)
    python scripts/viewer_screenshot.py RUN docs/viewer.png [--curves docs/viewer_curves.png]

Needs Chromium and chromedriver (scripts/setup_browser.sh) and selenium (the dev extra).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from agentrl.viewer import Catalog, ViewerServer


def chromium(profile: Path) -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--no-first-run",
                 "--disable-sync", f"--user-data-dir={profile}", "--window-size=1500,950"):  # fmt: skip
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver") or "chromedriver"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--curves", type=Path, help="also screenshot the Curves tab here")
    args = parser.parse_args()
    with ViewerServer(Catalog(args.run)) as server, tempfile.TemporaryDirectory() as profile:
        driver = chromium(Path(profile))
        try:
            wait = WebDriverWait(driver, 30)
            driver.get(server.url)
            wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#episode-table tbody tr"))
            Select(driver.find_element(By.ID, "filter-source")).select_by_value("eval")
            wait.until(lambda d: d.find_element(By.ID, "list-count").text.endswith("episodes"))
            rows = driver.find_elements(By.CSS_SELECTOR, "#episode-table tbody tr")
            rows[0].click()
            wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#episode-detail .tok"))
            compare = Select(driver.find_element(By.ID, "compare-select"))
            if len(compare.options) > 1:
                compare.select_by_index(len(compare.options) - 1)
                wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#compare-detail .tok"))
            args.out.parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(args.out))
            if args.curves:
                driver.find_element(By.ID, "tab-curves").click()
                wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#curves .chart"))
                driver.save_screenshot(str(args.curves))
        finally:
            driver.quit()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
