"""The fixed choices of claw-bench's options, in a module that imports nothing: the CLI builds
its options from them without importing the planner or the judge's HTTP client."""

from __future__ import annotations

#: group keys: the task, or task+harness (the spelling claw-tree samples --group-by uses)
GROUP_BY = ("task", "task+harness")
#: plan --network: none (no network), proxy (only the proxy, at a loopback port), host (the host's; the job record's policy names)
NETWORKS = ("none", "proxy", "host")
#: the APIs an LLM judge may speak
JUDGE_APIS = ("openai", "anthropic")
#: claw-sandbox run --executor: where the jobs run
EXECUTORS = ("local", "ray")
