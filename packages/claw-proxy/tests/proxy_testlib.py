"""Shared helpers for the claw-proxy tests: the tiny model of the repository, a secret, tokens,
scripted replies and reference logprobs."""

from __future__ import annotations

import json
from pathlib import Path

from claw_proxy import mint_token

ROOT = Path(__file__).resolve().parents[3]


TINY = ROOT / "tests" / "fixtures" / "tiny-qwen3"


HARNESS_REQUESTS = Path(__file__).parent / "fixtures" / "harness-requests"


SECRET = "test-secret"


ADMIN = "admin-token"


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


def tool_call_text(name: str, arguments: dict) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def write_script(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def token(session: str = "s1", **tags) -> str:
    return mint_token(session, SECRET, tags or None)


def reference_logprobs(model, call) -> list[float]:
    """What a call's completion_logprobs must be, from an independent forward pass over its
    prompt + completion under its recorded `sampling`: 0.0 for greedy tokens (which must be the
    argmax); otherwise log_softmax(logits / T) over the kept set, renormalised. The kept set is
    computed here as vLLM does: top_k by the k-th largest value, then top_p by sorting ascending
    and dropping the tokens whose ascending cumulative probability is <= 1 - top_p."""
    import torch

    ids = torch.tensor([call.prompt_ids + call.completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double()
    s = call.sampling
    t, top_p, top_k = s.get("temperature", 1.0), s.get("top_p", 1.0), s.get("top_k", 0)
    n = len(call.prompt_ids)
    out = []
    for i, tok in enumerate(call.completion_ids):
        row = logits[n - 1 + i]
        if t == 0:
            assert tok == int(row.argmax())
            out.append(0.0)
            continue
        row = row / t
        if 0 < top_k < row.numel():
            row = torch.where(row < row.sort(descending=True).values[top_k - 1], -torch.inf, row)
        if top_p < 1:
            asc, idx = row.sort()
            cum = torch.softmax(asc, -1).cumsum(-1)
            drop = cum <= 1 - top_p
            drop[-1] = False
            row = row.clone()
            row[idx[drop]] = -torch.inf
        out.append(float(torch.log_softmax(row, -1)[tok]))
    return out
