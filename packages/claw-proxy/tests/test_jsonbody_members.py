"""Big top-level members re-sent as they were (a harness's `tools` on every call) are taken as
parsed and checked before (`_jsonbody._MEMBERS`): the same value as a plain parse, the same
errors, and nothing wrong is ever kept."""

from __future__ import annotations

import json

import pytest
from claw_proxy import _jsonbody
from claw_proxy._jsonbody import loads, loads_split
from claw_proxy.errors import RequestError

TOOLS = [
    {"type": "function", "function": {"name": f"t{i}", "description": "d " * 40}} for i in range(4)
]


@pytest.fixture(autouse=True)
def fresh_members(monkeypatch):
    monkeypatch.setattr(_jsonbody, "_MEMBERS", _jsonbody._Members())


def _body(**kw) -> bytes:
    return json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw}
    ).encode()


def test_a_resent_member_is_taken_not_parsed(monkeypatch):
    """The second body's tools are the first body's value (not parsed or checked again); a
    changed text, a small member and a string are parsed; every value equals a plain parse."""
    first, _ = loads_split(_body(tools=TOOLS, system="s" * 400))
    checked: list = []
    real = _jsonbody._check
    with monkeypatch.context() as m:
        m.setattr(_jsonbody, "_check", lambda roots, *a: checked.extend(roots) or real(roots, *a))
        raw = _body(tools=TOOLS, system="s" * 400)
        again, _ = loads_split(raw)
    assert again["tools"] is first["tools"] and again == loads(raw)
    top = {where[0] for _, _, where in checked if where[1] is None}  # (name, no parent)
    assert top == {"model", "system"}  # and the message, under "messages" (no known split)
    changed = [*TOOLS[:3], {"type": "function", "function": {"name": "t9"}}]
    raw = _body(tools=changed)
    other, _ = loads_split(raw)
    assert other["tools"] is not first["tools"] and other == loads(raw)
    raw = _body(tools=[{"type": "function"}])  # small: parsed each time, never kept
    assert loads_split(raw)[0]["tools"] is not loads_split(raw)[0]["tools"]


def test_a_bad_member_is_refused_every_time():
    """A lone surrogate in big tools is refused, on every request: it was never kept."""
    raw = _body(tools=TOOLS)[:-1] + b',"x":[' + b'"' + b"a" * 300 + b'\\udfff"]}'
    for _ in range(2):
        with pytest.raises(RequestError, match="surrogate") as e:
            loads_split(raw)
        assert e.value.param == "x[0]"


def test_a_duplicate_member_name_takes_the_last_value():
    """Of two members of one name the last wins (json.loads's rule), kept or parsed."""
    loads_split(_body(tools=TOOLS))
    raw = _body(tools=TOOLS)[:-1] + b',"tools":[1]}'
    assert loads_split(raw)[0] == loads(raw) and loads(raw)["tools"] == [1]
    raw = b'{"tools":[1],' + _body(tools=TOOLS)[1:]
    assert loads_split(raw)[0] == loads(raw) and loads(raw)["tools"] == TOOLS
