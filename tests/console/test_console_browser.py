"""The console in a real browser: Debian's headless Chromium, driven through chromium-driver
by Selenium, against a `tidelog console` process on a real `tidelog serve`.

The test clicks through overview -> topic -> messages -> search -> group -> reset as a person
would, waiting for each page's elements (never sleeping), and checks what is rendered; the
reset is then read back with confluent-kafka, which resumes the group where the page put it.
Screenshots of each page are saved under the test's temporary directory (the path is printed),
or under $TIDELOG_CONSOLE_SCREENSHOTS when that is set.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from interop_broker import BrokerProcess, free_port, venv_bin
from interop_data import wait_until
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

from tidelog.client import Admin, Consumer, NewTopic, OffsetAndMetadata, Producer, TopicPartition

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# How long one page may take to show an element before the test fails.
PAGE_TIMEOUT_S = 30


@pytest.fixture
def console_url(broker: BrokerProcess, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    log_path = tmp_path / "console.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                str(venv_bin() / "tidelog"),
                "console",
                "--bootstrap-server",
                broker.bootstrap,
                "--port",
                str(port),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"tidelog console exited: {log_path.read_text()}")
        try:
            with urllib.request.urlopen(f"{url}/static/console.css", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    try:
        wait_until(answers, "the console to answer", timeout=30)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # As root on a machine without a network beyond loopback: no sandbox, no background
    # connections, a profile of its own.
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        f"--user-data-dir={tempfile.mkdtemp(prefix='chromium-', dir=tmp_path)}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def shots_dir(tmp_path: Path) -> Path:
    where = Path(os.environ.get("TIDELOG_CONSOLE_SCREENSHOTS") or tmp_path / "screenshots")
    where.mkdir(parents=True, exist_ok=True)
    return where


def wait_for(driver: WebDriver, element_id: str) -> object:
    return WebDriverWait(driver, PAGE_TIMEOUT_S).until(
        ec.visibility_of_element_located((By.ID, element_id))
    )


def test_click_through_overview_topic_messages_search_group_reset(
    broker: BrokerProcess, console_url: str, browser: WebDriver, tmp_path: Path
) -> None:
    topic = "browser-orders"
    group = "browser-billing"
    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, 3, 1)])
        with Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5}) as producer:
            for i in range(600):
                headers = [("trace", b"needle-in-browser" if i == 301 else f"t-{i}".encode())]
                producer.send(
                    topic,
                    value=f'{{"order": {i}, "amount": {i * 3}}}'.encode(),
                    key=f"customer-{i % 17}".encode(),
                    headers=headers,
                    partition=i % 3,
                )
            producer.flush()
        with Consumer(
            {"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False}
        ) as member:
            tps = [TopicPartition(topic, p) for p in range(3)]
            member.assign(tps)
            member.commit({tp: OffsetAndMetadata(150) for tp in tps})
    shots = shots_dir(tmp_path)
    print(f"screenshots in {shots}")

    # Overview: the broker, the controller, healthy partitions.
    browser.get(console_url + "/")
    brokers = wait_for(browser, "brokers")
    assert broker.bootstrap in brokers.text  # type: ignore[attr-defined]
    assert browser.find_element(By.ID, "offline").text == "0"
    browser.save_screenshot(str(shots / "1-overview.png"))

    # Topics -> the topic: three partitions of 200 records each.
    browser.find_element(By.LINK_TEXT, "Topics").click()
    wait_for(browser, "topics")
    browser.find_element(By.LINK_TEXT, topic).click()
    assert wait_for(browser, "topic-name").text == topic  # type: ignore[attr-defined]
    assert browser.find_element(By.ID, "message-count").text == "600"
    rows = browser.find_elements(By.CSS_SELECTOR, "#partitions tbody tr")
    assert len(rows) == 3
    browser.save_screenshot(str(shots / "2-topic.png"))

    # Messages: the first page of 100, with a next page.
    browser.find_element(By.ID, "browse").click()
    assert wait_for(browser, "shown-count").text == "100"  # type: ignore[attr-defined]
    assert browser.find_element(By.ID, "next-page").is_displayed()
    first_value = browser.find_element(By.CSS_SELECTOR, "#messages tr.message td.value")
    assert '"order"' in first_value.text  # JSON, pretty-printed
    browser.save_screenshot(str(shots / "3-messages.png"))

    # Search by a header value.
    box = browser.find_element(By.ID, "search")
    box.clear()
    box.send_keys("needle-in-browser")
    Select(browser.find_element(By.NAME, "in")).select_by_value("headers")
    browser.find_element(By.ID, "go").click()
    assert wait_for(browser, "found-count").text == "1"  # type: ignore[attr-defined]
    found = browser.find_elements(By.CSS_SELECTOR, "#messages tr.message")
    assert len(found) == 1
    assert found[0].get_attribute("data-partition") == "1"
    assert found[0].get_attribute("data-offset") == "100"
    assert "needle-in-browser" in found[0].find_element(By.CSS_SELECTOR, "td.headers").text
    assert browser.find_element(By.ID, "scan-complete").is_displayed()
    scanned = [td.text for td in browser.find_elements(By.CSS_SELECTOR, "#progress td.scanned-to")]
    assert scanned == ["200", "200", "200"]
    browser.save_screenshot(str(shots / "4-search.png"))

    # Consumer groups -> the group: lag 3 x (200 - 150).
    browser.find_element(By.LINK_TEXT, "Consumer groups").click()
    wait_for(browser, "groups")
    browser.find_element(By.LINK_TEXT, group).click()
    assert wait_for(browser, "group-state").text == "Empty"  # type: ignore[attr-defined]
    assert browser.find_element(By.ID, "total-lag").text == "150"
    browser.save_screenshot(str(shots / "5-group.png"))

    # Reset partition 0 to offset 42: preview, then apply.
    Select(browser.find_element(By.ID, "reset-kind")).select_by_value("offset")
    browser.find_element(By.NAME, f"offset|{topic}|0").send_keys("42")
    browser.find_element(By.ID, "preview").click()
    wait_for(browser, "reset-preview")
    planned = browser.find_elements(By.CSS_SELECTOR, "#plan td.new-offset")
    assert [td.text for td in planned] == ["42"]
    browser.save_screenshot(str(shots / "6-reset-preview.png"))
    browser.find_element(By.ID, "apply").click()
    wait_for(browser, "reset-done")
    browser.save_screenshot(str(shots / "7-reset-done.png"))
    browser.find_element(By.ID, "back-to-group").click()
    wait_for(browser, "offsets")
    committed_cell = browser.find_element(
        By.CSS_SELECTOR, f'#offsets tr[data-topic="{topic}"][data-partition="0"] td.committed'
    )
    assert committed_cell.text == "42"

    # confluent-kafka, as a member of the group, resumes partition 0 at 42.
    resumed = KafkaConsumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    try:
        resumed.assign([KafkaTopicPartition(topic, 0)])
        first: list[int] = []

        def polled() -> bool:
            message = resumed.poll(0.5)
            if message is not None and message.error() is None:
                first.append(message.offset())
            return bool(first)

        wait_until(polled, "a record of the reset partition", timeout=30)
        assert first[0] == 42
    finally:
        resumed.close()
