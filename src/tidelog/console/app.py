"""The console's web application: Starlette routes rendering Jinja2 templates.

Pages are plain HTML forms and links, so every page works without JavaScript. One admin
client and one producer are shared by all requests (made when the app starts, closed when it
stops); each browse or search makes its own consumer, without a group, that reads only what
the page asked for.

Errors: a Kafka error (:class:`~tidelog.client.ClientError`) is shown on the page by its
name and the description from the error table, with status 400 for a refused request, 404
for an unknown topic or group and 503 when the cluster cannot be reached; a bad value typed
into a form (:class:`~tidelog.console.forms.InputError`) is shown with status 400. Nothing
else reaches the browser as a stack trace: an unexpected failure is logged and answered 500.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import html
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, MutableMapping
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from tidelog.client import (
    AlterConfigOp,
    BrokerConnectionError,
    ClientError,
    ConfigResource,
    ConsumerRecord,
    NewTopic,
    PartialFailureError,
    RequestTimeoutError,
    TopicPartition,
)
from tidelog.client.aio.admin import AIOAdmin
from tidelog.client.aio.producer import AIOProducer
from tidelog.client.groups import RESET_KINDS, ResetSpec
from tidelog.console import forms, model, render
from tidelog.console.forms import InputError
from tidelog.console.scan import (
    PartitionProgress,
    ProgressCallback,
    ScanResult,
    scan,
    text_matcher,
)
from tidelog.protocol import ErrorCode
from tidelog.protocol.acls import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)

log = logging.getLogger("tidelog.console")

HERE = Path(__file__).parent
# Where a streamed search page puts its progress and results.
_SCAN_MARK = "@@SCAN@@"

PAGE_SIZE = 100
MAX_PAGE_SIZE = 500
# Search bounds: defaults and the most a request may ask for.
SEARCH_RECORDS = 1_000_000
MAX_SEARCH_RECORDS = 50_000_000
SEARCH_SECONDS = 10
MAX_SEARCH_SECONDS = 120
# Browsing a page reads at most this long (a page of 500 records takes far less).
BROWSE_SECONDS = 15

MODES = ("oldest", "newest", "offset", "timestamp")

# What the ACL forms offer: Kafka's names of resource types, patterns, operations and
# permissions (UNKNOWN is never sent; ANY and MATCH select, they are not bound).
ACL_RESOURCE_TYPES = tuple(t.name for t in ResourceType if t > ResourceType.ANY)
ACL_PATTERNS = ("LITERAL", "PREFIXED")
ACL_FILTER_PATTERNS = ("ANY", "MATCH", *ACL_PATTERNS)
ACL_OPERATIONS = tuple(o.name for o in AclOperation if o > AclOperation.ANY)
ACL_PERMISSIONS = ("ALLOW", "DENY")
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
# Kafka's default iteration count for a SCRAM credential, and the bounds it accepts.
SCRAM_ITERATIONS = 4096
SCRAM_MIN_ITERATIONS = 4096
SCRAM_MAX_ITERATIONS = 16384
# The states of Kafka's transaction coordinator, as ListTransactions filters them.
TRANSACTION_STATES = (
    "Empty",
    "Ongoing",
    "PrepareCommit",
    "PrepareAbort",
    "CompleteCommit",
    "CompleteAbort",
    "Dead",
    "PrepareEpochFence",
)
SEARCH_FIELDS = ("any", "key", "value", "headers")

# Error codes that mean "no such thing": answered 404.
_NOT_FOUND = frozenset(
    {
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.UNKNOWN_TOPIC_ID,
        ErrorCode.GROUP_ID_NOT_FOUND,
        ErrorCode.TRANSACTIONAL_ID_NOT_FOUND,
    }
)


@dataclass
class ConsoleConfig:
    bootstrap_servers: str
    auth_user: str | None = None
    auth_password: str | None = None
    read_only: bool = False
    # How often a running search sends a line of progress to the page.
    progress_every: float = 0.5
    client_config: dict[str, Any] = field(default_factory=dict)

    def client(self, **extra: Any) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.bootstrap_servers,
            "client.id": "tidelog-console",
            **self.client_config,
            **extra,
        }


class Clients:
    """The admin client and, once the first record is produced, the producer."""

    def __init__(self, config: ConsoleConfig) -> None:
        self.config = config
        # A page waits at most this long for the cluster instead of the clients' minute.
        self.admin = AIOAdmin(config.client(**{"default.api.timeout.ms": 15_000}))
        self._producer: AIOProducer | None = None

    def producer(self) -> AIOProducer:
        if self._producer is None:
            self._producer = AIOProducer(
                self.config.client(**{"linger.ms": 0, "max.block.ms": 15_000})
            )
        return self._producer

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.close()
        await self.admin.close()


# -- errors -------------------------------------------------------------------------------------


def _error_status(exc: ClientError) -> int:
    if isinstance(exc, BrokerConnectionError | RequestTimeoutError):
        return 503
    if exc.code in _NOT_FOUND:
        return 404
    return 400


def _kafka_errors(exc: ClientError) -> list[tuple[str, str, str]]:
    """(name, description from the error table, what the client said) of each failure."""
    items = list(exc.errors.values()) if isinstance(exc, PartialFailureError) else [exc]
    out = []
    for item in items:
        if item.code is None:
            out.append(("", "", item.message))
        else:
            out.append((item.code.name, item.code.message, str(item)))
    return out


# -- the application ----------------------------------------------------------------------------


def create_app(config: ConsoleConfig) -> Starlette:
    # Starlette's environment escapes HTML in every template (autoescape on).
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    env = templates.env
    env.filters["bytes"] = render.human_bytes
    env.filters["when"] = render.timestamp_text
    env.globals["show"] = render.show_bytes
    env.globals["read_only"] = config.read_only
    env.globals["bootstrap"] = config.bootstrap_servers

    def page(request: Request, template: str, status: int = 200, /, **context: Any) -> Response:
        response: Response = templates.TemplateResponse(
            request, template, context, status_code=status
        )
        return response

    def clients(request: Request) -> Clients:
        found: Clients = request.app.state.clients
        return found

    def writable() -> None:
        if config.read_only:
            raise InputError("the console runs read-only (--read-only): nothing can be changed")

    # -- error pages ----------------------------------------------------------------------------

    async def on_client_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ClientError)
        return page(
            request,
            "error.html",
            _error_status(exc),
            title="Kafka error",
            errors=_kafka_errors(exc),
        )

    async def on_input_error(request: Request, exc: Exception) -> Response:
        return page(request, "error.html", 400, title="Bad input", errors=[("", "", str(exc))])

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        title = HTTPStatus(exc.status_code).phrase
        return page(
            request, "error.html", exc.status_code, title=title, errors=[("", "", exc.detail)]
        )

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        log.exception("console: %s %s failed", request.method, request.url.path)
        return page(
            request,
            "error.html",
            500,
            title="Console error",
            errors=[("", "", f"{type(exc).__name__}: the console failed; see its log")],
        )

    # -- overview and topics --------------------------------------------------------------------

    async def overview(request: Request) -> Response:
        return page(request, "overview.html", view=await model.overview(clients(request).admin))

    async def topics(request: Request) -> Response:
        q = forms.text(request.query_params, "q")
        internal = request.query_params.get("internal") == "1"
        rows = await model.topic_rows(
            clients(request).admin, include_internal=internal, filter_text=q
        )
        return page(request, "topics.html", rows=rows, q=q, internal=internal)

    async def topic(request: Request) -> Response:
        name = request.path_params["name"]
        detail = await model.topic_detail(clients(request).admin, name)
        return page(request, "topic.html", detail=detail, name=name)

    async def topic_new(request: Request) -> Response:
        writable()
        return page(request, "topic_new.html", values={})

    async def topic_create(request: Request) -> Response:
        writable()
        values = await _form(request)
        name = forms.text(values, "name")
        if not name:
            raise InputError("topic name: required")
        new = NewTopic(
            name=name,
            num_partitions=forms.integer(values, "partitions", default=-1, low=-1),
            replication_factor=forms.integer(values, "replication_factor", default=-1, low=-1),
            configs=dict(forms.pairs(forms.text(values, "configs"), "configs")),
        )
        await clients(request).admin.create_topics([new])
        return RedirectResponse(f"/topics/{name}", status_code=303)

    async def topic_delete(request: Request) -> Response:
        writable()
        name = request.path_params["name"]
        info = await model.describe_topic(clients(request).admin, name)
        if request.method == "GET":
            return page(request, "topic_delete.html", info=info, name=name)
        values = await _form(request)
        if forms.text(values, "confirm") != name:
            raise InputError(f"to delete topic {name!r}, type its name to confirm")
        await clients(request).admin.delete_topics([name])
        return RedirectResponse("/topics", status_code=303)

    async def topic_config(request: Request) -> Response:
        writable()
        name = request.path_params["name"]
        values = await _form(request)
        key = forms.text(values, "config")
        if not key:
            raise InputError("config name: required")
        if forms.text(values, "action") == "delete":
            op = AlterConfigOp(key, None, "delete")
        else:
            op = AlterConfigOp(key, values.get("value", ""), "set")
        await model.describe_topic(clients(request).admin, name)
        await clients(request).admin.alter_configs({ConfigResource("topic", name): [op]})
        return RedirectResponse(f"/topics/{name}#configuration", status_code=303)

    # -- messages -------------------------------------------------------------------------------

    async def messages(request: Request) -> Response:
        name = request.path_params["name"]
        admin = clients(request).admin
        info = await model.describe_topic(admin, name)
        q = request.query_params
        all_partitions = [p.partition for p in info.partitions]
        chosen_text = forms.text(q, "partition", "all") or "all"
        if chosen_text == "all":
            chosen = all_partitions
        else:
            chosen = [forms.integer(q, "partition", low=0, high=len(all_partitions) - 1)]
        mode = forms.text(q, "mode", "oldest") or "oldest"
        if mode not in MODES:
            raise InputError(f"mode {mode!r}: expected one of {', '.join(MODES)}")
        size = forms.integer(q, "limit", default=PAGE_SIZE, low=1, high=MAX_PAGE_SIZE)
        search = forms.text(q, "q")
        fields = forms.text(q, "in", "any") or "any"
        if fields not in SEARCH_FIELDS:
            raise InputError(f"search in {fields!r}: expected one of {', '.join(SEARCH_FIELDS)}")
        max_records = forms.integer(
            q, "max_records", default=SEARCH_RECORDS, low=1, high=MAX_SEARCH_RECORDS
        )
        max_seconds = forms.integer(
            q, "max_seconds", default=SEARCH_SECONDS, low=1, high=MAX_SEARCH_SECONDS
        )
        tps = [TopicPartition(name, p) for p in chosen]
        starts, ends = await model.offsets_of(admin, tps)
        first = {tp.partition: starts[tp] for tp in tps if tp in starts}
        last = {tp.partition: ends[tp] for tp in tps if tp in ends}
        until_raw = forms.text(q, "until")
        if until_raw:
            # The end offsets of the search a next page or a download continues: the same
            # range, whatever was written since.
            until = forms.cursor(until_raw, set(chosen))
            last = {p: min(last[p], until.get(p, last[p])) for p in chosen}
        cursor_raw = forms.text(q, "cursor")
        if cursor_raw:
            begin = forms.cursor(cursor_raw, set(chosen))
            begin = {p: max(begin.get(p, last[p]), first[p]) for p in chosen}
        elif mode == "oldest":
            begin = dict(first)
        elif mode == "newest":
            begin = {p: max(first[p], last[p] - size) for p in chosen}
        elif mode == "offset":
            offset = forms.integer(q, "offset", low=0)
            begin = {p: min(max(offset, first[p]), last[p]) for p in chosen}
        else:
            when = forms.timestamp_ms(forms.text(q, "timestamp"))
            found = await admin.list_offsets({tp: when for tp in tps})
            begin = {
                tp.partition: last[tp.partition] if r.offset < 0 else r.offset
                for tp, r in found.items()
            }
        newest = mode == "newest" and not cursor_raw and not search
        params = {
            "partition": chosen_text,
            "mode": mode,
            "limit": str(size),
            "q": search,
            "in": fields,
            "max_records": str(max_records),
            "max_seconds": str(max_seconds),
            "until": forms.cursor_text(last),
        }
        # The same request again, bounded by the same end offsets, as a file.
        this_page = dict(
            params,
            offset=q.get("offset", ""),
            timestamp=q.get("timestamp", ""),
            cursor=cursor_raw,
            download="json",
        )
        context: dict[str, Any] = {
            "name": name,
            "info": info,
            "params": params,
            "search": search,
            "download_url": f"/topics/{name}/messages?{urlencode(this_page)}",
            "form": {**params, "offset": q.get("offset", ""), "timestamp": q.get("timestamp", "")},
        }

        async def run(on_progress: ProgressCallback | None = None) -> ScanResult:
            return await scan(
                clients(request).config.client(),
                name,
                begin,
                last,
                limit=size * len(chosen) if newest else size,
                max_records=max_records if search else MAX_SEARCH_RECORDS,
                max_seconds=max_seconds if search else BROWSE_SECONDS,
                matcher=text_matcher(search, fields) if search else None,
                on_progress=on_progress,
                progress_every=config.progress_every,
            )

        def outcome(result: ScanResult) -> dict[str, Any]:
            next_url = None
            if not result.complete:
                more = dict(params, cursor=forms.cursor_text(result.cursor()))
                next_url = f"/topics/{name}/messages?{urlencode(more)}"
            records = _ordered(result, newest=newest, size=size)
            return {"records": records, "result": result, "next_url": next_url}

        if forms.text(q, "download") == "json":
            result = await run()
            return _download(name, _ordered(result, newest=newest, size=size))
        if search:
            return _streamed_search(request, templates, context, run, outcome)
        result = await run()
        return page(request, "messages.html", **context, **outcome(result))

    # -- produce --------------------------------------------------------------------------------

    async def produce_form(request: Request) -> Response:
        writable()
        admin = clients(request).admin
        names = await admin.list_topics()
        values = {"topic": request.query_params.get("topic", "")}
        return page(request, "produce.html", topics=names, values=values, written=None)

    async def produce(request: Request) -> Response:
        writable()
        admin = clients(request).admin
        values = await _form(request)
        name = forms.text(values, "topic")
        if not name:
            raise InputError("topic: required")
        info = await model.describe_topic(admin, name)
        partition: int | None = None
        if forms.text(values, "partition"):
            partition = forms.integer(
                values, "partition", low=0, high=len(info.partitions) - 1, label="partition"
            )
        headers = [(k, v.encode()) for k, v in forms.pairs(values.get("headers", ""), "headers")]
        key_text = values.get("key", "")
        metadata = (
            await clients(request)
            .producer()
            .send_and_wait(
                name,
                values.get("value", "").encode(),
                key=key_text.encode() if key_text else None,
                headers=headers,
                partition=partition,
            )
        )
        return page(
            request,
            "produce.html",
            topics=await admin.list_topics(),
            values=dict(values),
            written=metadata,
        )

    # -- consumer groups ------------------------------------------------------------------------

    async def groups(request: Request) -> Response:
        admin = clients(request).admin
        listed = await admin.list_groups()
        rows = await model.group_details(admin, [g.group_id for g in listed])
        return page(request, "groups.html", rows=rows)

    async def group(request: Request) -> Response:
        gid = request.path_params["group"]
        detail = await _group(clients(request).admin, gid)
        topics = sorted({r.tp.topic for r in detail.offsets})
        return page(request, "group.html", detail=detail, topics=topics, kinds=RESET_KINDS)

    async def reset(request: Request) -> Response:
        writable()
        gid = request.path_params["group"]
        admin = clients(request).admin
        detail = await _group(admin, gid)
        values = await _form(request)
        description = detail.description
        if not description.is_inactive:
            raise InputError(
                f"offsets of group {gid!r} can be reset only when it is inactive, but its "
                f"state is {description.state} with {len(description.members)} member(s); "
                "stop its consumers first"
            )
        spec, partitions, exact = await _reset_request(admin, detail, values)
        plan = await model.plan_group_reset(admin, gid, spec, partitions, exact)
        execute = forms.text(values, "action") == "execute"
        if execute:
            await admin.alter_consumer_group_offsets(gid, plan)
        current = {r.tp: r.committed for r in detail.offsets}
        return page(
            request,
            "reset.html",
            group=gid,
            plan=sorted(plan.items()),
            current=current,
            executed=execute,
            values=list(values.items()),
        )

    async def group_delete(request: Request) -> Response:
        writable()
        gid = request.path_params["group"]
        values = await _form(request)
        if forms.text(values, "confirm") != gid:
            raise InputError(f"to delete group {gid!r}, type its name to confirm")
        # The coordinator refuses a group with members (NON_EMPTY_GROUP), shown as such.
        await clients(request).admin.delete_groups([gid])
        return RedirectResponse("/groups", status_code=303)

    async def _group(admin: AIOAdmin, gid: str) -> model.GroupDetail:
        detail = await model.group_detail(admin, gid)
        if detail is None:
            raise ClientError(
                f"consumer group {gid!r} does not exist", code=ErrorCode.GROUP_ID_NOT_FOUND
            )
        return detail

    async def _reset_request(
        admin: AIOAdmin, detail: model.GroupDetail, values: dict[str, str]
    ) -> tuple[ResetSpec, list[TopicPartition], dict[TopicPartition, int]]:
        kind = forms.text(values, "kind")
        if kind not in RESET_KINDS:
            raise InputError(f"reset to {kind!r}: expected one of {', '.join(RESET_KINDS)}")
        scope = forms.text(values, "topic", "*") or "*"
        known = sorted({r.tp for r in detail.offsets})
        if scope == "*":
            partitions = known
        else:
            info = await model.describe_topic(admin, scope)
            partitions = [TopicPartition(scope, p.partition) for p in info.partitions]
        exact: dict[TopicPartition, int] = {}
        if kind == "offset":
            for tp in partitions:
                field_name = f"offset|{tp.topic}|{tp.partition}"
                if forms.text(values, field_name):
                    exact[tp] = forms.integer(values, field_name, low=0, label=f"offset of {tp}")
            partitions = sorted(exact)
            if not partitions:
                raise InputError(
                    "reset to exact offsets: type an offset for at least one partition"
                )
            return ResetSpec("offset"), partitions, exact
        if not partitions:
            raise InputError(f"group {detail.description.group_id!r} has no partitions to reset")
        if kind == "datetime":
            return (
                ResetSpec(kind, forms.timestamp_ms(forms.text(values, "datetime"))),
                partitions,
                {},
            )
        if kind == "shift":
            return ResetSpec(kind, forms.integer(values, "shift", label="shift by")), partitions, {}
        return ResetSpec(kind), partitions, {}

    # -- cluster, ACLs, users and transactions ---------------------------------------------------

    async def cluster(request: Request) -> Response:
        return page(request, "cluster.html", view=await model.cluster_view(clients(request).admin))

    async def acls(request: Request) -> Response:
        q = request.query_params
        principal = forms.text(q, "principal")
        resource_type = forms.choice(q, "resource_type", ("ANY", *ACL_RESOURCE_TYPES), "ANY")
        resource_name = forms.text(q, "resource_name")
        pattern = forms.choice(q, "pattern", ACL_FILTER_PATTERNS, "ANY")
        if pattern == "MATCH" and not resource_name:
            raise InputError("pattern MATCH: give the resource name the ACLs apply to")
        acl_filter = AclBindingFilter(
            resource_type=ResourceType[resource_type],
            resource_name=resource_name or None,
            pattern_type=PatternType[pattern],
            principal=principal or None,
        )
        found = await model.acls(clients(request).admin, acl_filter)
        return page(
            request,
            "acls.html",
            **_listing(found),
            filters={
                "principal": principal,
                "resource_type": resource_type,
                "resource_name": resource_name,
                "pattern": pattern,
            },
            resource_types=ACL_RESOURCE_TYPES,
            filter_patterns=ACL_FILTER_PATTERNS,
            patterns=ACL_PATTERNS,
            operations=ACL_OPERATIONS,
            permissions=ACL_PERMISSIONS,
        )

    async def acl_create(request: Request) -> Response:
        writable()
        binding = _acl_binding(await _form(request))
        await clients(request).admin.create_acls([binding])
        return RedirectResponse("/acls", status_code=303)

    async def acl_delete(request: Request) -> Response:
        writable()
        binding = _acl_binding(await _form(request))
        # The exact binding, not a pattern: one row of the page deletes that row only.
        exact = AclBindingFilter(
            binding.resource_type,
            binding.resource_name,
            binding.pattern_type,
            binding.principal,
            binding.host,
            binding.operation,
            binding.permission,
        )
        await clients(request).admin.delete_acls([exact])
        return RedirectResponse("/acls", status_code=303)

    async def users(request: Request) -> Response:
        found = await model.scram_users(clients(request).admin)
        return page(
            request,
            "users.html",
            **_listing(found),
            mechanisms=SCRAM_MECHANISMS,
            default_iterations=SCRAM_ITERATIONS,
        )

    async def user_upsert(request: Request) -> Response:
        writable()
        values = await _form(request)
        user, mechanism = _credential(values)
        iterations = forms.integer(
            values,
            "iterations",
            default=SCRAM_ITERATIONS,
            low=SCRAM_MIN_ITERATIONS,
            high=SCRAM_MAX_ITERATIONS,
        )
        # The password is taken as typed: spaces are part of it.
        password = values.get("password", "")
        if not password:
            raise InputError("password: required")
        await clients(request).admin.alter_user_scram_credentials(
            upsertions=[(user, mechanism, iterations, password)]
        )
        return RedirectResponse("/users", status_code=303)

    async def user_delete(request: Request) -> Response:
        writable()
        user, mechanism = _credential(await _form(request))
        await clients(request).admin.alter_user_scram_credentials(deletions=[(user, mechanism)])
        return RedirectResponse("/users", status_code=303)

    async def transactions(request: Request) -> Response:
        state = forms.text(request.query_params, "state")
        if state:
            state = forms.choice(request.query_params, "state", TRANSACTION_STATES)
        found = await model.transactions(clients(request).admin, [state] if state else [])
        return page(
            request,
            "transactions.html",
            **_listing(found),
            state=state,
            states=TRANSACTION_STATES,
        )

    async def transaction(request: Request) -> Response:
        tid = request.path_params["tid"]
        admin = clients(request).admin
        detail = await model.describe_transaction(admin, tid)
        # The producers of every partition in the transaction, in one request per leader.
        states = await model.producers(admin, list(detail.partitions))
        return page(request, "transaction.html", detail=detail, producers=states)

    async def producers(request: Request) -> Response:
        q = request.query_params
        name = forms.text(q, "topic")
        if not name:
            raise InputError("topic: required")
        admin = clients(request).admin
        info = await model.describe_topic(admin, name)
        partition = forms.integer(q, "partition", low=0, high=len(info.partitions) - 1)
        tp = TopicPartition(name, partition)
        states = await model.producers(admin, [tp])
        found = states if isinstance(states, model.Unavailable) else states[tp]
        return page(request, "producers.html", tp=tp, found=found)

    def _acl_binding(values: dict[str, str]) -> AclBinding:
        resource_type = forms.choice(values, "resource_type", ACL_RESOURCE_TYPES)
        name = forms.text(values, "resource_name")
        if resource_type == "CLUSTER" and not name:
            name = "kafka-cluster"
        if not name:
            raise InputError("resource name: required")
        principal = forms.text(values, "principal")
        if not principal:
            raise InputError("principal: required, as Type:name (User:alice, User:*)")
        return AclBinding(
            ResourceType[resource_type],
            name,
            PatternType[forms.choice(values, "pattern", ACL_PATTERNS, "LITERAL")],
            principal,
            forms.text(values, "host", "*") or "*",
            AclOperation[forms.choice(values, "operation", ACL_OPERATIONS)],
            AclPermissionType[forms.choice(values, "permission", ACL_PERMISSIONS, "ALLOW")],
        )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        app.state.clients = Clients(config)
        try:
            yield
        finally:
            await app.state.clients.close()

    routes = [
        Route("/", overview),
        Route("/topics", topics),
        Route("/topics/new", topic_new),
        Route("/topics", topic_create, methods=["POST"]),
        Route("/topics/{name}", topic),
        Route("/topics/{name}/delete", topic_delete, methods=["GET", "POST"]),
        Route("/topics/{name}/configs", topic_config, methods=["POST"]),
        Route("/topics/{name}/messages", messages),
        Route("/produce", produce_form),
        Route("/produce", produce, methods=["POST"]),
        Route("/groups", groups),
        # Group ids may hold any character, "/" included.
        Route("/groups/{group:path}/reset", reset, methods=["POST"]),
        Route("/groups/{group:path}/delete", group_delete, methods=["POST"]),
        Route("/groups/{group:path}", group),
        Route("/cluster", cluster),
        Route("/acls", acls),
        Route("/acls", acl_create, methods=["POST"]),
        Route("/acls/delete", acl_delete, methods=["POST"]),
        Route("/users", users),
        Route("/users", user_upsert, methods=["POST"]),
        Route("/users/delete", user_delete, methods=["POST"]),
        Route("/transactions", transactions),
        Route("/transactions/{tid:path}", transaction),
        Route("/producers", producers),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            ClientError: on_client_error,
            InputError: on_input_error,
            HTTPException: on_http_error,
            Exception: on_unexpected,
        },
    )
    app.add_middleware(GuardMiddleware, config=config)
    return app


def _listing(found: object) -> dict[str, Any]:
    """A list page's context: what was found, or why nothing could be (shown in its place)."""
    return {
        "found": found,
        "unavailable": found if isinstance(found, model.Unavailable) else None,
    }


def _credential(values: dict[str, str]) -> tuple[str, str]:
    """The user and SCRAM mechanism a credential form names."""
    user = forms.text(values, "user")
    if not user:
        raise InputError("user: required")
    return user, forms.choice(values, "mechanism", SCRAM_MECHANISMS)


async def _form(request: Request) -> dict[str, str]:
    """The form's text fields (the console's forms upload no files)."""
    form = await request.form()
    return {k: v for k, v in form.multi_items() if isinstance(v, str)}


def _streamed_search(
    request: Request,
    templates: Jinja2Templates,
    context: dict[str, Any],
    run: Callable[[ProgressCallback], Coroutine[Any, Any, ScanResult]],
    outcome: Callable[[ScanResult], dict[str, Any]],
) -> Response:
    """The search page, sent while the search runs: the page down to the form, then a line
    of progress now and then (CSS shows the last), then the results and the rest. The
    browser renders each part as it arrives. A Kafka error once the page has begun is shown
    where the results would be (the status, 200, has been sent by then)."""
    shell = templates.get_template("messages.html").render(
        {**context, "request": request, "streaming": True}
    )
    head, tail = shell.split(_SCAN_MARK, 1)

    async def body() -> AsyncIterator[str]:
        ticks: asyncio.Queue[str] = asyncio.Queue()

        def report(progress: dict[int, PartitionProgress], examined: int, kept: int) -> None:
            where = ", ".join(
                f"partition {p.partition} at {p.next:,} of {p.end:,}" for p in progress.values()
            )
            ticks.put_nowait(
                f'<div class="tick">Searching… {examined:,} records examined, {kept:,} '
                f"found; {html.escape(where)}</div>\n"
            )

        task = asyncio.create_task(run(report))
        yield head
        try:
            while not task.done():
                waiter = asyncio.ensure_future(ticks.get())
                await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
                if waiter.done():
                    yield waiter.result()
                else:
                    waiter.cancel()
            result = task.result()
        except ClientError as exc:
            errors = templates.get_template("error_items.html").render(
                {"errors": _kafka_errors(exc)}
            )
            yield f'</div><div class="alert" id="error">{errors}</div>{tail[len("</div>") :]}'
            return
        finally:
            if not task.done():
                task.cancel()
        results = templates.get_template("messages_results.html").render(
            {**context, **outcome(result), "request": request}
        )
        yield tail.replace("</div>", "</div>" + results, 1)

    return StreamingResponse(body(), media_type="text/html; charset=utf-8")


def _download(topic: str, records: list[ConsumerRecord]) -> Response:
    """The records of a page as JSON lines, keys, values and header values as UTF-8 text or,
    when they are not, hex (``*_encoding`` says which)."""
    lines = []
    for r in records:
        key, key_encoding = render.text_or_hex(r.key)
        value, value_encoding = render.text_or_hex(r.value)
        headers = []
        for hname, hvalue in r.headers:
            text, encoding = render.text_or_hex(hvalue)
            headers.append({"name": hname, "value": text, "encoding": encoding})
        line = {
            "topic": r.topic,
            "partition": r.partition,
            "offset": r.offset,
            "timestamp": r.timestamp,
            "key": key,
            "key_encoding": key_encoding,
            "value": value,
            "value_encoding": value_encoding,
            "headers": headers,
        }
        lines.append(json.dumps(line, ensure_ascii=False))
    body = "".join(f"{line}\n" for line in lines)
    return Response(
        body,
        media_type="application/x-ndjson",
        headers={"Content-Disposition": f'attachment; filename="{topic}-messages.jsonl"'},
    )


def _ordered(result: ScanResult, *, newest: bool, size: int) -> list[ConsumerRecord]:
    if len(result.progress) == 1:
        records = sorted(result.records, key=lambda r: r.offset)
    else:
        records = sorted(result.records, key=lambda r: (r.timestamp, r.partition, r.offset))
    return records[-size:] if newest else records


# -- authentication and cross-site requests ----------------------------------------------------

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class GuardMiddleware:
    """Basic authentication of every path (pages, forms and static files) when a user is
    configured, and, for every POST, a same-origin check: a browser that holds the console's
    credentials must not be made to submit a form from another site."""

    def __init__(
        self, app: Callable[[Scope, Receive, Send], Awaitable[None]], config: ConsoleConfig
    ) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.config.auth_user is not None and not self._authorized(headers.get("authorization")):
            response: Response = Response(
                "Authentication required.\n",
                status_code=401,
                headers={"WWW-Authenticate": 'Basic realm="tidelog console", charset="UTF-8"'},
            )
            await response(scope, receive, send)
            return
        if scope["method"] == "POST" and not _same_origin(headers):
            response = Response("Cross-site form submissions are refused.\n", status_code=403)
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _authorized(self, header: str | None) -> bool:
        if not header or not header.lower().startswith("basic "):
            return False
        try:
            decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
        except ValueError:
            return False
        user, sep, password = decoded.partition(":")
        expected_user = self.config.auth_user or ""
        expected_password = self.config.auth_password or ""
        # Both compared in full, in constant time, so neither leaks by timing.
        user_ok = hmac.compare_digest(user.encode(), expected_user.encode())
        password_ok = hmac.compare_digest(password.encode(), expected_password.encode())
        return bool(sep) and user_ok and password_ok


def _same_origin(headers: dict[str, str]) -> bool:
    """A POST whose Origin (or, without one, Referer) names another host is cross-site; one
    with neither (curl, old browsers) is let through."""
    source = headers.get("origin") or headers.get("referer")
    if not source or source == "null":
        return source != "null"
    return urlsplit(source).netloc == headers.get("host", "")


__all__ = ["ConsoleConfig", "GuardMiddleware", "create_app"]
