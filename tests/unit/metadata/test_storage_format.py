"""Formatting a node's dirs with a cluster id (`tidelog storage format`), without a process."""

from __future__ import annotations

import base64
import random
from pathlib import Path

import pytest

from tidelog.metadata.configs import BrokerConfig
from tidelog.metadata.errors import MetaPropertiesError
from tidelog.metadata.meta_properties import (
    META_PROPERTIES,
    MetaProperties,
    check_cluster_id,
    ensure_meta_properties,
    format_dirs,
    generate_cluster_id,
    read_meta_properties,
)
from tidelog.metadata.storage_format import format_storage
from tidelog.runtime.filelock import LockHeldError
from tidelog.runtime.system import Runtime, random_uuid
from tidelog.storage import lock_log_dirs

CLUSTER_ID = generate_cluster_id(random.Random(1))


def _runtime(seed: int = 5) -> Runtime:
    return Runtime.seeded(seed, clock=lambda: 0)


def _config(tmp_path: Path, **extra: str) -> BrokerConfig:
    values = {
        "log.dirs": f"{tmp_path / 'a'},{tmp_path / 'b'}",
        "metadata.log.dir": str(tmp_path / "meta"),
        "node.id": "4",
        **extra,
    }
    return BrokerConfig(values)


def _dirs(tmp_path: Path) -> list[Path]:
    return [tmp_path / "a", tmp_path / "b", tmp_path / "meta"]


def test_cluster_id_is_kafkas_form_drawn_from_the_injected_source() -> None:
    ids = [generate_cluster_id(random.Random(seed)) for seed in range(300)]
    for cluster_id in ids:
        assert len(cluster_id) == 22
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16
        assert not cluster_id.startswith("-")
        check_cluster_id(cluster_id)
    # Same seed, same id: the id comes from the source, not from uuid4.
    assert generate_cluster_id(random.Random(7)) == generate_cluster_id(random.Random(7))
    assert len(set(ids)) == len(ids)
    # A seed whose first draw spells an id starting with '-' gets the next draw instead.
    seed = next(
        s
        for s in range(10_000)
        if base64.urlsafe_b64encode(random_uuid(random.Random(s)).bytes).startswith(b"-")
    )
    source = random.Random(seed)
    random_uuid(source)
    second = base64.urlsafe_b64encode(random_uuid(source).bytes).decode().rstrip("=")
    assert generate_cluster_id(random.Random(seed)) == second


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "abc",
        CLUSTER_ID + "A",  # 23 characters
        CLUSTER_ID[:21],
        CLUSTER_ID + "==",  # padding
        "!" + CLUSTER_ID[1:],  # not base64
        "+" + CLUSTER_ID[1:],  # standard base64, not URL-safe
        "AAAAAAAAAAAAAAAAAAAAAB",  # bits past the 16 bytes: not the canonical spelling
    ],
)
def test_invalid_cluster_ids_are_refused(bad: str) -> None:
    with pytest.raises(MetaPropertiesError, match="is not valid") as info:
        check_cluster_id(bad)
    assert "\n" not in str(info.value)


def test_format_writes_kafkas_meta_properties_in_every_dir(tmp_path: Path) -> None:
    dirs = _dirs(tmp_path)
    result = format_dirs(dirs, cluster_id=CLUSTER_ID, node_id=4, source=random.Random(3))
    assert result.formatted == tuple(dirs) and result.already_formatted == ()
    directory_ids = set()
    for directory in dirs:
        props = read_meta_properties(directory)
        assert props is not None
        assert (props.cluster_id, props.node_id, props.version) == (CLUSTER_ID, 4, 1)
        assert props.directory_id is not None
        check_cluster_id(props.directory_id)  # a directory id has the same form
        directory_ids.add(props.directory_id)
        text = (directory / META_PROPERTIES).read_text()
        keys = {line.split("=")[0] for line in text.splitlines() if not line.startswith("#")}
        assert keys == {"version", "cluster.id", "node.id", "directory.id"}
    assert len(directory_ids) == len(dirs)
    # A node started on the formatted dirs takes their id and writes nothing new.
    before = [(d / META_PROPERTIES).read_bytes() for d in dirs]
    assert ensure_meta_properties(dirs, node_id=4, cluster_id=None) == CLUSTER_ID
    assert [(d / META_PROPERTIES).read_bytes() for d in dirs] == before


def test_a_formatted_dir_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    a, b, meta = _dirs(tmp_path)
    format_dirs([b], cluster_id=CLUSTER_ID, node_id=4)
    before = (b / META_PROPERTIES).read_bytes()
    with pytest.raises(MetaPropertiesError, match="already formatted") as info:
        format_dirs([a, b, meta], cluster_id=CLUSTER_ID, node_id=4)
    assert "--ignore-formatted" in str(info.value) and "\n" not in str(info.value)
    assert read_meta_properties(a) is None and read_meta_properties(meta) is None
    assert (b / META_PROPERTIES).read_bytes() == before


def test_ignore_formatted_formats_the_others_and_keeps_the_formatted(tmp_path: Path) -> None:
    a, b, meta = _dirs(tmp_path)
    format_dirs([b], cluster_id=CLUSTER_ID, node_id=4)
    before = (b / META_PROPERTIES).read_bytes()
    result = format_dirs([a, b, meta], cluster_id=CLUSTER_ID, node_id=4, ignore_formatted=True)
    assert result.formatted == (a, meta) and result.already_formatted == (b,)
    assert (b / META_PROPERTIES).read_bytes() == before
    assert read_meta_properties(a) == MetaProperties(
        CLUSTER_ID,
        4,
        read_meta_properties(a).directory_id,  # type: ignore[union-attr]
    )
    again = format_dirs([a, b, meta], cluster_id=CLUSTER_ID, node_id=4, ignore_formatted=True)
    assert again.formatted == () and again.already_formatted == (a, b, meta)


@pytest.mark.parametrize(
    ("cluster_id", "node_id"), [(generate_cluster_id(random.Random(2)), 4), (CLUSTER_ID, 5)]
)
def test_ignore_formatted_still_refuses_a_dir_of_another_cluster_or_node(
    tmp_path: Path, cluster_id: str, node_id: int
) -> None:
    a, b, _ = _dirs(tmp_path)
    format_dirs([b], cluster_id=CLUSTER_ID, node_id=4)
    with pytest.raises(MetaPropertiesError, match="must all agree"):
        format_dirs([a, b], cluster_id=cluster_id, node_id=node_id, ignore_formatted=True)
    assert read_meta_properties(a) is None


def test_format_storage_formats_the_configs_dirs_and_releases_them(tmp_path: Path) -> None:
    config = _config(tmp_path)
    result = format_storage(config, CLUSTER_ID, _runtime())
    assert result.formatted == tuple(_dirs(tmp_path))
    for directory in _dirs(tmp_path):
        props = read_meta_properties(directory)
        assert props is not None and (props.cluster_id, props.node_id) == (CLUSTER_ID, 4)
    # The same seed draws the same directory ids: randomness comes from the runtime.
    other = tmp_path / "again"
    format_storage(_config(other), CLUSTER_ID, _runtime())
    assert [read_meta_properties(d) for d in _dirs(other)] == [
        read_meta_properties(d) for d in _dirs(tmp_path)
    ]
    # The locks were released: a broker can own the dirs now.
    for lock in lock_log_dirs(_dirs(tmp_path)):
        lock.release()


def test_format_storage_refuses_dirs_a_broker_holds(tmp_path: Path) -> None:
    locks = lock_log_dirs([tmp_path / "meta"])
    try:
        with pytest.raises(LockHeldError):
            format_storage(_config(tmp_path), CLUSTER_ID, _runtime())
    finally:
        for lock in locks:
            lock.release()
    assert all(read_meta_properties(d) is None for d in _dirs(tmp_path))


def test_format_storage_refuses_an_id_other_than_the_configured_one(tmp_path: Path) -> None:
    configured = generate_cluster_id(random.Random(9))
    with pytest.raises(MetaPropertiesError, match=r"cluster\.id is .* --cluster-id"):
        format_storage(_config(tmp_path, **{"cluster.id": configured}), CLUSTER_ID, _runtime())
    assert all(read_meta_properties(d) is None for d in _dirs(tmp_path))
    result = format_storage(_config(tmp_path, **{"cluster.id": CLUSTER_ID}), CLUSTER_ID, _runtime())
    assert len(result.formatted) == 3


def test_first_start_draws_its_ids_from_the_injected_source(tmp_path: Path) -> None:
    first = ensure_meta_properties(
        [tmp_path / "x"], node_id=1, cluster_id=None, source=random.Random(11)
    )
    second = ensure_meta_properties(
        [tmp_path / "y"], node_id=1, cluster_id=None, source=random.Random(11)
    )
    assert first == second
    assert read_meta_properties(tmp_path / "x") == read_meta_properties(tmp_path / "y")
