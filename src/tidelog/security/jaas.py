"""The one JAAS entry a broker reads: ``listener.name.<l>.plain.sasl.jaas.config``.

Kafka's PlainLoginModule takes its users as options of the login module::

    org.apache.kafka.common.security.plain.PlainLoginModule required
        username="admin" password="admin-secret"
        user_admin="admin-secret" user_alice="alice-secret";

``user_<name>="<password>"`` defines a user the broker accepts; ``username`` and
``password`` are what the broker itself would log in with on an inter-broker listener.
The text is parsed strictly (Kafka's JaasConfig grammar: one module, a control flag,
``key=value`` options with quoted or bare values, a closing ``;``); anything else is a
:class:`JaasConfigError` naming what was wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["PLAIN_LOGIN_MODULE", "JaasConfigError", "JaasEntry", "parse_jaas_config", "plain_users"]

PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
_FLAGS = ("required", "requisite", "sufficient", "optional")
_TOKEN = re.compile(
    r"""\s*(?:
        (?P<quoted>"(?:[^"\\]|\\.)*")
      | (?P<word>[^\s=;"]+)
      | (?P<equals>=)
      | (?P<semicolon>;)
    )""",
    re.VERBOSE | re.DOTALL,
)


class JaasConfigError(ValueError):
    pass


@dataclass(frozen=True)
class JaasEntry:
    login_module: str
    flag: str
    options: dict[str, str]


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    position = 0
    while position < len(text):
        if text[position:].strip() == "":
            break
        match = _TOKEN.match(text, position)
        if match is None:
            raise JaasConfigError(f"unexpected text at {text[position : position + 20]!r}")
        position = match.end()
        kind = match.lastgroup
        assert kind is not None
        value = match.group(kind)
        if kind == "quoted":
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        tokens.append((kind, value))
    return tokens


def parse_jaas_config(text: str) -> JaasEntry:
    """The single login module entry of a ``sasl.jaas.config`` value."""
    tokens = _tokens(text)
    if len(tokens) < 3:
        raise JaasConfigError("expected '<LoginModule> <flag> <options>;'")
    (kind, module), (flag_kind, flag) = tokens[0], tokens[1]
    if kind != "word":
        raise JaasConfigError("expected a login module class name first")
    if flag_kind != "word" or flag.lower() not in _FLAGS:
        raise JaasConfigError(f"login module control flag must be one of {', '.join(_FLAGS)}")
    options: dict[str, str] = {}
    rest = tokens[2:]
    index = 0
    while index < len(rest) and rest[index][0] != "semicolon":
        if (
            index + 2 >= len(rest)
            or rest[index][0] != "word"
            or rest[index + 1][0] != "equals"
            or rest[index + 2][0] not in ("word", "quoted")
        ):
            raise JaasConfigError("expected key=value options ending with ';'")
        key = rest[index][1]
        if key in options:
            raise JaasConfigError(f"option {key} is given twice")
        options[key] = rest[index + 2][1]
        index += 3
    if index >= len(rest):
        raise JaasConfigError("the login module entry must end with ';'")
    if index + 1 != len(rest):
        raise JaasConfigError("only one login module is allowed in sasl.jaas.config")
    return JaasEntry(module, flag.lower(), options)


def plain_users(text: str) -> dict[str, str]:
    """The users (name -> password) a PlainLoginModule entry defines."""
    entry = parse_jaas_config(text)
    if entry.login_module != PLAIN_LOGIN_MODULE:
        raise JaasConfigError(
            f"the PLAIN mechanism needs {PLAIN_LOGIN_MODULE}, not {entry.login_module}"
        )
    users = {
        key[len("user_") :]: value
        for key, value in entry.options.items()
        if key.startswith("user_") and len(key) > len("user_")
    }
    if not users:
        raise JaasConfigError('defines no user: add user_<name>="<password>" options')
    return users
