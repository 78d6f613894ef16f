"""Harness thinking switches, and the reasoning part of an answer.

Each API has its own switch: Anthropic `thinking` (``{"type": "enabled", "budget_tokens": N}``,
``{"type": "disabled"}``, ``{"type": "adaptive"}``), Chat Completions `reasoning_effort`
(``none`` ... ``max``) and Responses `reasoning.effort`. A switch is read into a `Thinking`
(on or off). Where the policy's chat template has a switch of its own (it reads
`enable_thinking`, as Qwen3's does), the request's switch reaches it as that keyword. Where it
has none, ``claw-proxy serve --thinking record`` (the default) serves the call and records the
switch as not applied, ``--thinking refuse`` answers 400, as ``--sampling`` does for sampling
settings: a record never claims a setting the policy did not sample under. Budgets and effort
levels are recorded as asked; the template switch is only on or off.
"""

from __future__ import annotations

import attrs

from claw_proxy.errors import RequestError

THINKING_POLICIES = ("record", "refuse")
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


@attrs.frozen(kw_only=True)
class Thinking:
    """A request's thinking switch: `field` where it was, `asked` its value as sent."""

    field: str
    asked: object
    enabled: bool


def _effort(value, field: str) -> bool:
    if not isinstance(value, str) or value not in EFFORTS:
        raise RequestError(f"expected one of {', '.join(EFFORTS)}, got {value!r}", field)
    return value != "none"


def _object(body: dict, field: str) -> dict | None:
    """The request's `field` when it is an object, None when absent; a 400 naming it otherwise."""
    raw = body.get(field)
    if raw is not None and not isinstance(raw, dict):
        raise RequestError(f"expected an object, got {type(raw).__name__}", field)
    return raw


def from_anthropic(body: dict) -> Thinking | None:
    raw = _object(body, "thinking")
    if raw is None:
        return None
    kind = raw.get("type")
    if kind not in ("enabled", "disabled", "adaptive"):
        raise RequestError(
            f"expected 'enabled', 'disabled' or 'adaptive', got {kind!r}", "thinking.type"
        )
    budget = raw.get("budget_tokens")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)):
        raise RequestError(
            f"expected an integer, got {type(budget).__name__}", "thinking.budget_tokens"
        )
    return Thinking(field="thinking", asked=raw, enabled=kind != "disabled")


def from_chat(body: dict) -> Thinking | None:
    raw = body.get("reasoning_effort")
    if raw is None:
        return None
    return Thinking(field="reasoning_effort", asked=raw, enabled=_effort(raw, "reasoning_effort"))


def from_responses(body: dict) -> Thinking | None:
    raw = _object(body, "reasoning")
    if raw is None:
        return None
    effort = raw.get("effort")
    if effort is None:
        return None
    return Thinking(
        field="reasoning.effort", asked=effort, enabled=_effort(effort, "reasoning.effort")
    )


def template_has_switch(tokenizer) -> bool:
    """Whether the tokenizer's chat template reads `enable_thinking`."""
    source = getattr(tokenizer, "chat_template", None)
    if isinstance(source, dict):
        source = source.get("default")
    if not isinstance(source, str) or "enable_thinking" not in source:
        return False
    import jinja2
    from jinja2 import meta

    try:
        ast = jinja2.Environment().parse(source)
    except jinja2.TemplateSyntaxError:
        return False
    return "enable_thinking" in meta.find_undeclared_variables(ast)


def apply(thinking: Thinking | None, has_switch: bool, policy: str) -> tuple[dict, dict | None]:
    """(the chat template's keyword arguments, the record's `sampling.thinking`) for a request's
    switch under `--thinking` `policy`; RequestError when it is refused."""
    if thinking is None:
        return {}, None
    record = {"field": thinking.field, "asked": thinking.asked, "enabled": thinking.enabled}
    if has_switch:
        return {"enable_thinking": thinking.enabled}, {**record, "applied": True}
    if policy == "refuse":
        raise RequestError(
            "the policy's chat template has no thinking switch (it does not read "
            "enable_thinking), so this setting cannot be honoured (claw-proxy serve --thinking "
            "refuse); leave it out, or serve with --thinking record to record it as not applied",
            thinking.field,
        )
    return {}, {**record, "applied": False}


def reasoning_tokens(text: str, ends: list[int], open_tag: str, close_tag: str) -> int:
    """How many sampled tokens hold reasoning: those whose text overlaps the span from
    `open_tag` to the end of `close_tag` (to the end of the answer when it never closed).
    `text` is the answer's decoded text and `ends[i]` where token i's text ends in it."""
    start = text.find(open_tag)
    if start < 0:
        return 0
    close = text.find(close_tag, start + len(open_tag))
    end = len(text) if close < 0 else close + len(close_tag)
    n, prev = 0, 0
    for e in ends:
        if e > start and prev < end:
            n += 1
        prev = e
        if prev >= end:
            break
    return n


__all__ = [
    "EFFORTS",
    "THINKING_POLICIES",
    "Thinking",
    "apply",
    "from_anthropic",
    "from_chat",
    "from_responses",
    "reasoning_tokens",
    "template_has_switch",
]
