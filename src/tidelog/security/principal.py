"""Who a connection is: Kafka's ``KafkaPrincipal`` and how TLS and SASL form it.

A principal is ``User:<name>``. On a PLAINTEXT or SASL listener before authentication,
and on an SSL listener whose client sent no certificate, it is ``User:ANONYMOUS``. After
SASL it is the authenticated user name. On SSL with a client certificate it is the
certificate's subject as an RFC 2253 distinguished name (what Java's
``X500Principal.getName()`` gives, the last RDN first), rewritten by
``ssl.principal.mapping.rules``.

The authorizer (ACLs) matches on :class:`KafkaPrincipal` values, so the type and name are
kept apart, never as one string to re-split.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "ANONYMOUS",
    "KafkaPrincipal",
    "PrincipalMappingError",
    "SslPrincipalMapper",
    "rfc2253_subject",
]

USER_TYPE = "User"


@dataclass(frozen=True, slots=True)
class KafkaPrincipal:
    principal_type: str
    name: str

    def __str__(self) -> str:
        return f"{self.principal_type}:{self.name}"

    @classmethod
    def user(cls, name: str) -> KafkaPrincipal:
        return cls(USER_TYPE, name)


ANONYMOUS = KafkaPrincipal(USER_TYPE, "ANONYMOUS")


class PrincipalMappingError(ValueError):
    """``ssl.principal.mapping.rules`` is malformed, or no rule applies to a subject."""


# -- distinguished names -----------------------------------------------------------------

# The attribute keywords RFC 2253 names; Python's ssl module gives OpenSSL's long names.
_RFC2253_KEYWORDS = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}
_SPECIALS = frozenset(',+"\\<>;=')


def _escape(value: str) -> str:
    out = []
    for i, char in enumerate(value):
        if char in _SPECIALS or (i == 0 and char in " #") or (i == len(value) - 1 and char == " "):
            out.append("\\" + char)
        else:
            out.append(char)
    return "".join(out)


def rfc2253_subject(subject: Sequence[Sequence[tuple[str, str]]]) -> str:
    """The RFC 2253 form of a subject as ``ssl.SSLSocket.getpeercert()['subject']`` gives
    it (RDNs in certificate order): ``CN=alice,OU=eng,O=Acme``.

    Attributes without an RFC 2253 keyword keep OpenSSL's name (``emailAddress=...``);
    Java would write their OID with a hex value there."""
    rdns = []
    for rdn in reversed(subject):
        rdns.append(
            "+".join(f"{_RFC2253_KEYWORDS.get(key, key)}={_escape(value)}" for key, value in rdn)
        )
    return ",".join(rdns)


# -- ssl.principal.mapping.rules ---------------------------------------------------------

# One rule: DEFAULT, or RULE:pattern/replacement/ with an optional L or U; a "/" inside
# the pattern or replacement is written "\/".
_RULE = re.compile(
    r"\s*(?:(?P<default>DEFAULT)|RULE:(?P<pattern>(?:\\.|[^\\/])*)/"
    r"(?P<replacement>(?:\\.|[^\\/])*)/(?P<case>[LU]?))\s*(?:,|\n|$)"
)
_JAVA_GROUP = re.compile(r"\$(\d+)")


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""

    def apply(self, dn: str) -> str | None:
        if self.pattern is None:
            return dn
        if self.pattern.fullmatch(dn) is None:
            return None
        result = self.pattern.sub(self.replacement, dn)
        if self.case == "L":
            return result.lower()
        if self.case == "U":
            return result.upper()
        return result


class SslPrincipalMapper:
    """``ssl.principal.mapping.rules``: the first rule whose pattern matches the whole DN
    gives the name (its replacement, with ``$1``... for groups, then lower/upper case
    with ``/L`` or ``/U``); ``DEFAULT`` gives the DN as it is. No rule matching is an
    error, as in Kafka (the client is refused)."""

    def __init__(self, rules: str = "DEFAULT") -> None:
        self.rules = self._parse(rules)

    @staticmethod
    def _parse(text: str) -> tuple[_Rule, ...]:
        rules: list[_Rule] = []
        position = 0
        text = text.strip()
        if not text:
            return (_Rule(None),)
        while position < len(text):
            match = _RULE.match(text, position)
            if match is None or match.end() == position:
                raise PrincipalMappingError(
                    f"cannot parse a rule at {text[position:]!r}: expected DEFAULT or "
                    "RULE:pattern/replacement/ with an optional L or U"
                )
            position = match.end()
            if match.group("default"):
                rules.append(_Rule(None))
                continue
            pattern_text = match.group("pattern").replace("\\/", "/")
            try:
                pattern = re.compile(pattern_text)
            except re.error as exc:
                raise PrincipalMappingError(f"pattern {pattern_text!r}: {exc}") from None
            replacement = _JAVA_GROUP.sub(
                r"\\g<\1>", match.group("replacement").replace("\\/", "/")
            )
            rules.append(_Rule(pattern, replacement, match.group("case")))
        return tuple(rules)

    def name(self, dn: str) -> str:
        for rule in self.rules:
            try:
                result = rule.apply(dn)
            except (re.error, IndexError) as exc:
                raise PrincipalMappingError(f"rule failed on {dn!r}: {exc}") from None
            if result is not None:
                return result
        raise PrincipalMappingError(f"no rule of ssl.principal.mapping.rules applies to {dn!r}")

    def principal(self, dn: str) -> KafkaPrincipal:
        return KafkaPrincipal.user(self.name(dn))
