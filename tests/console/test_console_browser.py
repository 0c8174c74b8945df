"""The console in a real browser: Debian's headless Chromium, driven through chromium-driver
by Selenium, against a `tidelog console` process on a real `tidelog serve`.

The test clicks through overview -> create a topic -> produce -> topic -> messages -> search
among 100,000 records -> group -> reset to a time, as a person would, waiting for each page's
elements (never sleeping), and checks what is rendered; the reset is then read back with
confluent-kafka, which resumes the group where the page put it.
Screenshots of each page are saved under the test's temporary directory (the path is printed),
or under $TIDELOG_CONSOLE_SCREENSHOTS when that is set.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from interop_broker import BrokerProcess, free_port, venv_bin
from interop_data import wait_until
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

from tidelog.client import Consumer, OffsetAndMetadata, TopicPartition

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# How long one page may take to show an element before the test fails.
PAGE_TIMEOUT_S = 30
# Records the search looks through, and the timestamp of the first.
RECORDS = 100_000
BASE_MS = 1_750_000_000_000


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


def fill(bootstrap: str, topic: str, count: int) -> None:
    """``count`` records over 3 partitions, record i in partition i % 3 with timestamp
    BASE_MS + i (so offset i // 3), written with confluent-kafka for speed."""
    producer = KafkaProducer({"bootstrap.servers": bootstrap, "linger.ms": 20, "log_level": 0})
    for i in range(count):
        while True:
            try:
                producer.produce(
                    topic,
                    f'{{"order": {i}, "amount": {i * 3}}}'.encode(),
                    key=f"customer-{i % 17}",
                    headers=[("trace", f"t-{i}")],
                    partition=i % 3,
                    timestamp=BASE_MS + i,
                )
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0


def test_click_through_overview_topic_messages_search_group_reset(
    broker: BrokerProcess, console_url: str, browser: WebDriver, tmp_path: Path
) -> None:
    topic = "browser-orders"
    group = "browser-billing"
    shots = shots_dir(tmp_path)
    print(f"screenshots in {shots}")

    # Overview: the broker, the controller, healthy partitions.
    browser.get(console_url + "/")
    brokers = wait_for(browser, "brokers")
    assert broker.bootstrap in brokers.text  # type: ignore[attr-defined]
    assert browser.find_element(By.ID, "offline").text == "0"
    browser.save_screenshot(str(shots / "1-overview.png"))

    # Topics -> Create topic: three partitions.
    browser.find_element(By.LINK_TEXT, "Topics").click()
    wait_for(browser, "topics")
    browser.find_element(By.ID, "new-topic").click()
    form = wait_for(browser, "create-topic")
    form.find_element(By.NAME, "name").send_keys(topic)  # type: ignore[attr-defined]
    form.find_element(By.NAME, "partitions").send_keys("3")  # type: ignore[attr-defined]
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()  # type: ignore[attr-defined]
    assert wait_for(browser, "topic-name").text == topic  # type: ignore[attr-defined]

    # 100,000 records, then one more produced through the page, with the header to find.
    fill(broker.bootstrap, topic, RECORDS)
    browser.find_element(By.ID, "produce-to-topic").click()
    produce_form = wait_for(browser, "produce-form")
    produce_form.find_element(By.NAME, "partition").send_keys("1")  # type: ignore[attr-defined]
    produce_form.find_element(By.NAME, "key").send_keys("customer-x")  # type: ignore[attr-defined]
    produce_form.find_element(By.NAME, "value").send_keys('{"order": "from the page"}')  # type: ignore[attr-defined]
    produce_form.find_element(By.NAME, "headers").send_keys("trace=needle-in-browser")  # type: ignore[attr-defined]
    browser.find_element(By.ID, "send").click()
    assert wait_for(browser, "written-offset").text == str(RECORDS // 3)  # type: ignore[attr-defined]
    browser.save_screenshot(str(shots / "2-produced.png"))

    # The topic: its partitions and message count.
    browser.find_element(By.LINK_TEXT, "Topics").click()
    wait_for(browser, "topics")
    browser.find_element(By.LINK_TEXT, topic).click()
    wait_for(browser, "topic-name")
    assert browser.find_element(By.ID, "message-count").text == str(RECORDS + 1)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#partitions tbody tr")) == 3
    browser.save_screenshot(str(shots / "3-topic.png"))

    # Messages: the first page of 100, with a next page.
    browser.find_element(By.ID, "browse").click()
    assert wait_for(browser, "shown-count").text == "100"  # type: ignore[attr-defined]
    assert browser.find_element(By.ID, "next-page").is_displayed()
    first_value = browser.find_element(By.CSS_SELECTOR, "#messages tr.message td.value")
    assert '"order"' in first_value.text  # JSON, pretty-printed
    browser.save_screenshot(str(shots / "4-messages.png"))

    # Search every partition by a header value: one record among 100,001.
    box = browser.find_element(By.ID, "search")
    box.clear()
    box.send_keys("needle-in-browser")
    Select(browser.find_element(By.NAME, "in")).select_by_value("headers")
    browser.find_element(By.ID, "go").click()
    assert wait_for(browser, "found-count").text == "1"  # type: ignore[attr-defined]
    found = browser.find_elements(By.CSS_SELECTOR, "#messages tr.message")
    assert len(found) == 1
    assert found[0].get_attribute("data-partition") == "1"
    assert found[0].get_attribute("data-offset") == str(RECORDS // 3)
    assert "needle-in-browser" in found[0].find_element(By.CSS_SELECTOR, "td.headers").text
    assert browser.find_element(By.ID, "scan-complete").is_displayed()
    ends = [RECORDS // 3 + (1 if p == 1 else 0) + (1 if p < RECORDS % 3 else 0) for p in range(3)]
    scanned = [td.text for td in browser.find_elements(By.CSS_SELECTOR, "#progress td.scanned-to")]
    assert scanned == [str(e) for e in ends]
    browser.save_screenshot(str(shots / "5-search.png"))

    # A group that has read everything, stopped: lag 0.
    with Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False}
    ) as member:
        tps = [TopicPartition(topic, p) for p in range(3)]
        member.assign(tps)
        member.commit({tp: OffsetAndMetadata(end) for tp, end in zip(tps, ends, strict=True)})
    browser.find_element(By.LINK_TEXT, "Consumer groups").click()
    wait_for(browser, "groups")
    browser.find_element(By.LINK_TEXT, group).click()
    assert wait_for(browser, "group-state").text == "Empty"  # type: ignore[attr-defined]
    assert browser.find_element(By.ID, "total-lag").text == "0"
    browser.save_screenshot(str(shots / "6-group.png"))

    # Reset to a time: record 30,000 is the first at BASE_MS + 30,000 ms, offset 10,000 of
    # partition 0 (and 30,001 and 30,002 are offset 10,000 of partitions 1 and 2).
    Select(browser.find_element(By.ID, "reset-kind")).select_by_value("datetime")
    moment = datetime.datetime.fromtimestamp((BASE_MS + 30_000) / 1000, tz=datetime.UTC)
    browser.find_element(By.NAME, "datetime").send_keys(moment.isoformat())
    browser.find_element(By.ID, "preview").click()
    wait_for(browser, "reset-preview")
    planned = browser.find_elements(By.CSS_SELECTOR, "#plan td.new-offset")
    assert [td.text for td in planned] == ["10000", "10000", "10000"]
    browser.save_screenshot(str(shots / "7-reset-preview.png"))
    browser.find_element(By.ID, "apply").click()
    wait_for(browser, "reset-done")
    browser.find_element(By.ID, "back-to-group").click()
    wait_for(browser, "offsets")
    assert browser.find_element(By.ID, "total-lag").text == str(sum(ends) - 30_000)
    browser.save_screenshot(str(shots / "8-group-after-reset.png"))

    # confluent-kafka, as a member of the group, resumes partition 0 at 10,000.
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
        assert first[0] == 10_000
    finally:
        resumed.close()


def test_click_through_cluster_users_transactions_and_acls(
    broker: BrokerProcess, console_url: str, browser: WebDriver, tmp_path: Path
) -> None:
    shots = shots_dir(tmp_path)
    print(f"screenshots in {shots}")
    browser.get(console_url + "/")
    wait_for(browser, "brokers")

    # Cluster: the broker active; a single node has no quorum, and the page says so.
    browser.find_element(By.LINK_TEXT, "Cluster").click()
    brokers = wait_for(browser, "brokers")
    assert "active" in brokers.text  # type: ignore[attr-defined]
    assert "does not serve DescribeQuorum" in wait_for(browser, "no-quorum").text  # type: ignore[attr-defined]
    browser.save_screenshot(str(shots / "9-cluster.png"))

    # Users: a SCRAM credential added through the form is listed.
    browser.find_element(By.LINK_TEXT, "Users").click()
    form = wait_for(browser, "user-upsert")
    form.find_element(By.NAME, "user").send_keys("browser-alice")  # type: ignore[attr-defined]
    Select(form.find_element(By.NAME, "mechanism")).select_by_visible_text("SCRAM-SHA-512")  # type: ignore[attr-defined]
    form.find_element(By.NAME, "password").send_keys("a password")  # type: ignore[attr-defined]
    browser.find_element(By.ID, "user-save").click()
    row = WebDriverWait(browser, PAGE_TIMEOUT_S).until(
        ec.visibility_of_element_located(
            (
                By.CSS_SELECTOR,
                '#users tr[data-user="browser-alice"][data-mechanism="SCRAM-SHA-512"]',
            )
        )
    )
    assert "4096" in row.text
    browser.save_screenshot(str(shots / "10-users.png"))

    # Transactions: the list, filtered by state.
    browser.find_element(By.LINK_TEXT, "Transactions").click()
    wait_for(browser, "transactions")
    Select(browser.find_element(By.NAME, "state")).select_by_visible_text("Ongoing")
    browser.find_element(By.CSS_SELECTOR, "#transaction-filter button").click()
    WebDriverWait(browser, PAGE_TIMEOUT_S).until(ec.url_contains("state=Ongoing"))
    wait_for(browser, "transactions")
    browser.save_screenshot(str(shots / "11-transactions.png"))

    # ACLs: without an authorizer the broker answers SECURITY_DISABLED, shown as such.
    browser.find_element(By.LINK_TEXT, "ACLs").click()
    note = wait_for(browser, "acls-unavailable")
    assert "SECURITY_DISABLED" in note.text  # type: ignore[attr-defined]
    browser.save_screenshot(str(shots / "12-acls.png"))
