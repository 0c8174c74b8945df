"""The console's cluster, ACL, user and transaction pages against a real `tidelog serve`,
through Starlette's TestClient.

What a page shows is checked against what the admin client reads from the same broker, and
what a form changes is read back with the admin client. The error paths are real too: a
broker without an authorizer answers SECURITY_DISABLED, a single node does not serve
DescribeQuorum, an unknown transactional id is TRANSACTIONAL_ID_NOT_FOUND.
"""

from __future__ import annotations

import html
import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from console_pages import element_text, row_cells
from interop_broker import BrokerProcess
from interop_data import wait_until
from starlette.testclient import TestClient

from tidelog.client import Admin, NewTopic, Producer, TopicPartition
from tidelog.console.app import ConsoleConfig, create_app
from tidelog.protocol.acls import AclBindingFilter

pytestmark = pytest.mark.slow

SECURED_ARGS = [
    "--override",
    "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "--override",
    "super.users=User:ANONYMOUS",
]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path_factory.mktemp("secured"), extra_args=SECURED_ARGS)
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def secured_console(secured: BrokerProcess) -> Iterator[TestClient]:
    with TestClient(create_app(ConsoleConfig(secured.bootstrap))) as client:
        yield client


def assert_refused(
    client: TestClient, path: str, base: dict[str, str], cases: list[tuple[dict[str, str], str]]
) -> None:
    """Each change to the valid form ``base`` is answered 400 with its reason."""
    for change, reason in cases:
        page = client.post(path, data={**base, **change})
        assert page.status_code == 400, change
        assert reason in text_of(page.text), change


def text_of(page: str) -> str:
    """The page's main content as text, one space between words."""
    main = page.split("<main>", 1)[1]
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", main)).strip())


# -- cluster and quorum --------------------------------------------------------------------


def test_cluster_page_counts_leaders_and_replicas_and_says_a_single_node_has_no_quorum(
    console: TestClient, admin: Admin, topic_name: str
) -> None:
    admin.create_topics([NewTopic(topic_name, 3, 1)])
    topics = admin.describe_topics()
    assert topic_name in topics
    cluster = admin.describe_cluster()
    (only,) = cluster.brokers
    led = sum(p.leader == only.node_id for t in topics.values() for p in t.partitions)
    held = sum(only.node_id in p.replicas for t in topics.values() for p in t.partitions)

    page = console.get("/cluster")
    assert page.status_code == 200
    assert element_text(page.text, "broker-count") == "1"
    assert element_text(page.text, "fenced-count") == "0"
    assert element_text(page.text, "controller") == str(cluster.controller_id)
    cells = row_cells(page.text, "brokers", broker=only.node_id)
    assert cells[1:] == [f"{only.host}:{only.port}", "-", "active", str(led), str(held)]
    assert led >= 3 and held >= 3
    # DescribeQuorum is not served by a single node: the section says so, not a failure.
    assert 'id="no-quorum"' in page.text
    assert "does not serve DescribeQuorum" in text_of(page.text)


def test_cluster_page_shows_the_quorum_and_a_fenced_broker(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parent.parent / "cluster"))
    from cluster_harness import Cluster

    nodes = Cluster(tmp_path)
    try:
        nodes.start()
        bootstrap = ",".join(f"127.0.0.1:{n.port}" for n in nodes.nodes.values())
        with TestClient(create_app(ConsoleConfig(bootstrap))) as console:

            def quorum_page() -> str | None:
                page = console.get("/cluster").text
                return page if 'id="quorum-replicas"' in page else None

            page = wait_until(quorum_page, "the cluster page to show the quorum")
            with Admin({"bootstrap.servers": bootstrap}) as admin:
                quorum = admin.describe_quorum()
            assert element_text(page, "quorum-leader") == str(quorum.leader_id)
            assert int(element_text(page, "quorum-epoch")) >= quorum.leader_epoch
            voters = re.findall(r'data-node="(\d+)" data-role="(\w+)"', page)
            assert sorted(int(n) for n, _ in voters) == [1, 2, 3]
            assert dict((int(n), role) for n, role in voters)[quorum.leader_id] == "leader"
            assert sorted(role for _, role in voters) == ["follower", "follower", "leader"]

            # A topic spread over the nodes, one replica a partition (as far as the
            # cluster replicates today).
            with Admin({"bootstrap.servers": bootstrap}) as admin:
                admin.create_topics([NewTopic("spread", 6, 1)])
                spread = wait_until(
                    lambda: admin.describe_topics(["spread"])["spread"], "the topic's metadata"
                )
            victim = next(
                p.leader for p in spread.partitions if p.leader not in (quorum.leader_id, -1)
            )
            on_victim = [p.partition for p in spread.partitions if p.replicas == (victim,)]
            assert on_victim
            topic_page = console.get("/topics/spread").text
            for n in on_victim:
                cells = row_cells(topic_page, "partitions", partition=n)
                assert cells[1:5] == [str(victim), str(victim), str(victim), "-"]
                assert cells[-1] == "in sync"

            # A partition moved from the quorum leader to the third node: the move stays
            # under way (the new replica does not catch up yet), shown as such, not as
            # under-replicated.
            third = next(n for n in nodes.nodes if n not in (quorum.leader_id, victim))
            moved = next(
                p.partition for p in spread.partitions if p.replicas == (quorum.leader_id,)
            )
            with Admin({"bootstrap.servers": bootstrap}) as admin:
                admin.alter_partition_reassignments({TopicPartition("spread", moved): [third]})

            def moving() -> list[str] | None:
                page = console.get("/topics/spread").text
                cells = row_cells(page, "partitions", partition=moved)
                return cells if cells[5] != "-" else None

            cells = wait_until(moving, "the topic page to show the reassignment")
            assert cells[2] == f"{third}, {quorum.leader_id}"  # target, then the one leaving
            assert cells[5] == (f"moving to {third}, adding {third}, removing {quorum.leader_id}")
            assert cells[-1] == "in sync"
            overview = console.get("/").text
            assert element_text(overview, "under-replicated") == "0"
            listed = row_cells(console.get("/topics").text, "topics", topic="spread")
            assert (listed[1], listed[4]) == ("6", "healthy")

            # A broker that stops heartbeating is fenced by the controller.
            nodes.nodes[victim].kill()

            def fenced() -> list[str] | None:
                page = console.get("/cluster").text
                cells = row_cells(page, "brokers", broker=victim)
                return cells if cells[3] == "fenced" else None

            cells = wait_until(fenced, f"broker {victim} to show as fenced")
            assert cells[4] == "0"  # a fenced broker leads nothing
            page = console.get("/cluster").text
            assert element_text(page, "fenced-count") == "1"

            # Its partitions have no leader, their replica is offline.
            def offline() -> str | None:
                page = console.get("/topics/spread").text
                cells = row_cells(page, "partitions", partition=on_victim[0])
                return page if cells[4] == str(victim) else None

            topic_page = wait_until(offline, f"the replicas on {victim} to show offline")
            for n in on_victim:
                cells = row_cells(topic_page, "partitions", partition=n)
                assert cells[1] == "none"
                assert cells[4] == str(victim)
                assert cells[-1] == "offline"
            others = [p.partition for p in spread.partitions if p.partition not in on_victim]
            for n in others:
                assert row_cells(topic_page, "partitions", partition=n)[-1] == "in sync"
    finally:
        nodes.close()


# -- topic partitions ------------------------------------------------------------------------


def test_topic_partitions_show_replicas_and_the_under_min_isr_marker(
    console: TestClient, admin: Admin, topic_name: str
) -> None:
    # One replica where two must be in sync: every partition is under min ISR (acks=all
    # producers are refused), yet fully replicated.
    admin.create_topics([NewTopic(topic_name, 2, 1, {"min.insync.replicas": "2"})])
    healthy = f"{topic_name}-ok"
    admin.create_topics([NewTopic(healthy, 1, 1)])
    info = admin.describe_topics([topic_name])[topic_name]

    page = console.get(f"/topics/{topic_name}").text
    assert element_text(page, "min-isr") == "2"
    assert 'id="reassignments-unavailable"' not in page
    for p in info.partitions:
        cells = row_cells(page, "partitions", partition=p.partition)
        assert cells[1:6] == [
            str(p.leader),
            ", ".join(map(str, p.replicas)),
            ", ".join(map(str, p.isr)),
            "-",  # no offline replica
            "-",  # no reassignment under way
        ]
        assert cells[-1] == "under min ISR"

    ok = console.get(f"/topics/{healthy}").text
    assert row_cells(ok, "partitions", partition=0)[-1] == "in sync"


# -- ACLs ------------------------------------------------------------------------------------


def test_acls_without_an_authorizer_show_security_disabled(console: TestClient) -> None:
    listing = console.get("/acls")
    assert listing.status_code == 200
    assert 'id="acls-unavailable" data-error="SECURITY_DISABLED"' in listing.text
    assert "No Authorizer is configured" in text_of(listing.text)
    refused = console.post(
        "/acls",
        data={
            "resource_type": "TOPIC",
            "resource_name": "t",
            "principal": "User:alice",
            "operation": "READ",
        },
    )
    assert refused.status_code == 400
    assert "SECURITY_DISABLED" in text_of(refused.text)
    assert "Security features are not enabled on the broker." in text_of(refused.text)


def test_acls_are_created_filtered_and_deleted_through_the_forms(
    secured_console: TestClient, secured: BrokerProcess
) -> None:
    name = f"acl-{uuid.uuid4().hex[:8]}"
    alice, bob = f"User:alice-{name}", f"User:bob-{name}"
    forms = [
        {"principal": alice, "resource_type": "TOPIC", "resource_name": name,
         "pattern": "LITERAL", "operation": "READ", "permission": "ALLOW", "host": "*"},
        {"principal": bob, "resource_type": "TOPIC", "resource_name": name[:6],
         "pattern": "PREFIXED", "operation": "WRITE", "permission": "DENY", "host": "10.0.0.1"},
        {"principal": alice, "resource_type": "GROUP", "resource_name": name,
         "pattern": "LITERAL", "operation": "DESCRIBE", "permission": "ALLOW", "host": "*"},
    ]  # fmt: skip
    for form in forms:
        created = secured_console.post("/acls", data=form, follow_redirects=False)
        assert created.status_code == 303, created.text

    with Admin({"bootstrap.servers": secured.bootstrap}) as admin:
        stored = {str(b) for b in admin.describe_acls(AclBindingFilter(principal=alice))}
        stored |= {str(b) for b in admin.describe_acls(AclBindingFilter(principal=bob))}
    assert len(stored) == 3

    def rows(**params: str) -> set[tuple[str, ...]]:
        page = secured_console.get("/acls", params=params)
        assert page.status_code == 200
        found = re.findall(r'<tr class="acl"[^>]*>(.*?)</tr>', page.text, re.S)
        # The seven fields of each ACL (the last cell holds its delete button).
        return {
            tuple(
                re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td>(.*?)</td>", r, re.S)
            )[:7]
            for r in found
        }

    everything = rows()
    assert (alice, "*", "ALLOW", "READ", "TOPIC", "LITERAL", name) in everything
    assert (bob, "10.0.0.1", "DENY", "WRITE", "TOPIC", "PREFIXED", name[:6]) in everything
    assert {r[3] for r in rows(principal=alice)} == {"READ", "DESCRIBE"}
    assert {r[3] for r in rows(principal=alice, resource_type="GROUP")} == {"DESCRIBE"}
    # MATCH: what applies to the topic named, its literal ACL and the prefix that starts it.
    matched = rows(resource_type="TOPIC", resource_name=name, pattern="MATCH")
    assert {(r[0], r[3]) for r in matched} >= {(alice, "READ"), (bob, "WRITE")}
    assert rows(principal=f"User:nobody-{name}") == set()

    deleted = secured_console.post("/acls/delete", data={**forms[0]}, follow_redirects=False)
    assert deleted.status_code == 303
    assert {r[3] for r in rows(principal=alice)} == {"DESCRIBE"}
    with Admin({"bootstrap.servers": secured.bootstrap}) as admin:
        left = admin.describe_acls(AclBindingFilter(principal=alice))
    assert [b.operation.name for b in left] == ["DESCRIBE"]


def test_acl_forms_refuse_bad_input_with_a_reason(secured_console: TestClient) -> None:
    base = {"principal": "User:x", "resource_type": "TOPIC", "resource_name": "t",
            "operation": "READ"}  # fmt: skip
    cases = [
        ({"operation": "FLY"}, "operation 'FLY': expected one of"),
        ({"resource_type": "TABLE"}, "resource_type 'TABLE': expected one of"),
        ({"principal": ""}, "principal: required"),
        ({"resource_name": ""}, "resource name: required"),
    ]
    assert_refused(secured_console, "/acls", base, cases)
    bad_filter = secured_console.get("/acls", params={"pattern": "MATCH"})
    assert bad_filter.status_code == 400
    # A principal without its type is refused by the broker, in Kafka's words.
    no_type = secured_console.post("/acls", data={**base, "principal": "alice"})
    assert no_type.status_code == 400
    assert re.search(r"INVALID_REQUEST|INVALID_PRINCIPAL", text_of(no_type.text))


# -- SCRAM users ---------------------------------------------------------------------------------


def test_scram_users_are_added_listed_and_deleted(console: TestClient, admin: Admin) -> None:
    user = f"user-{uuid.uuid4().hex[:8]}"
    for mechanism, iterations in (("SCRAM-SHA-256", "4096"), ("SCRAM-SHA-512", "8192")):
        saved = console.post(
            "/users",
            data={"user": user, "mechanism": mechanism, "iterations": iterations,
                  "password": "s3cret pass"},
            follow_redirects=False,
        )  # fmt: skip
        assert saved.status_code == 303, saved.text
    assert sorted(admin.describe_user_scram_credentials([user])[user]) == [
        ("SCRAM-SHA-256", 4096),
        ("SCRAM-SHA-512", 8192),
    ]
    page = console.get("/users").text
    assert row_cells(page, "users", user=user, mechanism="SCRAM-SHA-512")[:3] == [
        user,
        "SCRAM-SHA-512",
        "8192",
    ]
    assert "s3cret" not in page

    gone = console.post(
        "/users/delete", data={"user": user, "mechanism": "SCRAM-SHA-256"}, follow_redirects=False
    )
    assert gone.status_code == 303
    assert admin.describe_user_scram_credentials([user])[user] == [("SCRAM-SHA-512", 8192)]
    page = console.get("/users").text
    assert f'data-user="{user}" data-mechanism="SCRAM-SHA-256"' not in page

    # Deleting a credential that is not there: the controller's error, in Kafka's words.
    again = console.post("/users/delete", data={"user": user, "mechanism": "SCRAM-SHA-256"})
    assert again.status_code == 400
    assert "RESOURCE_NOT_FOUND" in text_of(again.text)


def test_scram_user_form_refuses_bad_input(console: TestClient) -> None:
    base = {"user": "u", "mechanism": "SCRAM-SHA-256", "password": "p"}
    cases = [
        ({"iterations": "100"}, "iterations 100: must be at least 4096"),
        ({"iterations": "99999"}, "iterations 99999: must be at most 16384"),
        ({"mechanism": "PLAIN"}, "mechanism 'PLAIN': expected one of"),
        ({"password": ""}, "password: required"),
        ({"user": " "}, "user: required"),
    ]
    assert_refused(console, "/users", base, cases)


# -- transactions ----------------------------------------------------------------------------


def test_an_open_transaction_is_listed_described_and_its_producer_shown(
    console: TestClient, broker: BrokerProcess, admin: Admin, topic_name: str
) -> None:
    admin.create_topics([NewTopic(topic_name, 2, 1)])
    tid = f"txn-{topic_name}"
    with Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": tid}) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic_name, b"in flight", partition=1).result()

        ongoing = console.get("/transactions", params={"state": "Ongoing"}).text
        cells = row_cells(ongoing, "transactions", tid=tid)
        (listed,) = [t for t in admin.list_transactions() if t.transactional_id == tid]
        assert cells == [tid, "Ongoing", str(listed.producer_id), str(listed.coordinator_id)]
        other_state = console.get("/transactions", params={"state": "CompleteCommit"}).text
        assert f'data-tid="{tid}"' not in other_state

        detail = console.get(f"/transactions/{tid}").text
        assert element_text(detail, "txn-state") == "Ongoing"
        assert element_text(detail, "txn-producer").startswith(f"{listed.producer_id} ·")
        # The partition in the transaction, with the producer's open transaction there.
        assert f'data-topic="{topic_name}" data-partition="1"' in detail
        assert re.search(
            rf'<tr data-producer="{listed.producer_id}">.*?offset 0</span>', detail, re.S
        )

        one = console.get("/producers", params={"topic": topic_name, "partition": "1"}).text
        assert f'<tr data-producer="{listed.producer_id}">' in one
        empty = console.get("/producers", params={"topic": topic_name, "partition": "0"}).text
        assert "No producer state." in empty
        producer.commit_transaction()

    def committed() -> bool:
        page = console.get("/transactions", params={"state": "CompleteCommit"}).text
        return f'data-tid="{tid}"' in page

    wait_until(committed, f"{tid} to be listed as CompleteCommit")
    done = console.get(f"/transactions/{tid}").text
    assert 'id="no-partitions"' in done


def test_transaction_pages_error_paths(console: TestClient, topic_name: str) -> None:
    unknown = console.get(f"/transactions/no-such-{topic_name}")
    assert unknown.status_code == 404
    assert "TRANSACTIONAL_ID_NOT_FOUND" in text_of(unknown.text)
    bad_state = console.get("/transactions", params={"state": "Sleeping"})
    assert bad_state.status_code == 400
    assert "state 'Sleeping': expected one of" in text_of(bad_state.text)
    no_topic = console.get("/producers", params={"topic": topic_name, "partition": "0"})
    assert no_topic.status_code == 404
    assert "UNKNOWN_TOPIC_OR_PARTITION" in text_of(no_topic.text)


def test_read_only_console_has_no_forms_and_refuses_changes(broker: BrokerProcess) -> None:
    with TestClient(create_app(ConsoleConfig(broker.bootstrap, read_only=True))) as console:
        for path in ("/acls", "/users"):
            page = console.get(path)
            assert page.status_code == 200
            assert 'method="post"' not in page.text
        refused = console.post(
            "/users", data={"user": "u", "mechanism": "SCRAM-SHA-256", "password": "p"}
        )
        assert refused.status_code == 400
        assert "read-only" in text_of(refused.text)


def test_pages_of_apis_another_kafka_implementation_does_not_serve_say_so(
    tmp_path: Path,
) -> None:
    """Tansu (another Kafka-compatible broker, from the interop kit) serves neither
    DescribeQuorum nor the transaction APIs: those sections say so, the pages still render."""
    tansu = BrokerProcess(tmp_path, kind="tansu")
    tansu.start()
    try:
        with Admin({"bootstrap.servers": tansu.bootstrap}) as other:
            other.create_topics([NewTopic("elsewhere", 2, 1)])
            (node,) = other.describe_cluster().brokers
        with TestClient(create_app(ConsoleConfig(tansu.bootstrap))) as client:
            cluster = client.get("/cluster")
            assert cluster.status_code == 200
            assert 'id="no-quorum"' in cluster.text
            assert row_cells(cluster.text, "brokers", broker=node.node_id)[3] == "active"

            topic = client.get("/topics/elsewhere").text
            for n in (0, 1):
                # Tansu lists every partition as a reassignment with nothing to add or
                # remove: none is under way.
                assert row_cells(topic, "partitions", partition=n)[5] == "-"

            listing = client.get("/transactions")
            assert listing.status_code == 200
            assert 'id="transactions-unavailable" data-error="UNSUPPORTED_VERSION"' in listing.text
            assert "does not serve ListTransactions" in text_of(listing.text)
            producers = client.get("/producers", params={"topic": "elsewhere", "partition": "1"})
            assert producers.status_code == 200
            assert 'id="producers-unavailable" data-error="UNSUPPORTED_VERSION"' in producers.text
    finally:
        tansu.stop()
