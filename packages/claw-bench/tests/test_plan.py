"""Planning writes one valid claw.job/v1 per (task, harness, sample), pointed at the proxy."""

from __future__ import annotations

import pytest
from _bench_schemas import validate
from claw_bench import PlanError, load_harness, load_suite, plan_jobs, verify_token
from claw_bench.plan import proxy_port, session_id

KEY = b"k"


def _plan(**kw):
    suite = load_suite("claw-mini").select(["csv-to-json-people", "fix-fizzbuzz"])
    hs = [load_harness("claw-agent-chat"), load_harness("openclaw-anthropic")]
    args = {"samples": 3, "proxy_url": "http://127.0.0.1:8123/", "secret": KEY, "run_id": "r1"} | kw
    return plan_jobs(list(suite.tasks), hs, **args)


def test_one_job_per_task_harness_sample_and_all_valid():
    """2 tasks x 2 harnesses x 3 samples = 12 schema-valid jobs with unique ids and sessions."""
    jobs = _plan()
    assert len(jobs) == 12
    for j in jobs:
        validate(j, "job")
    assert len({j["job_id"] for j in jobs}) == 12 == len({j["meta"]["session"] for j in jobs})
    j = jobs[0]
    assert j["meta"] == {
        "session": "r1-csv-to-json-people-claw-agent-chat-0",
        "task": "csv-to-json-people",
        "harness": "claw-agent-chat",
        "sample": 0,
        "group": "csv-to-json-people",
        "run_id": "r1",
        "api": "chat",
    }
    assert j["network"] == {"policy": "proxy", "proxy_url": "http://127.0.0.1:8123", "port": 8123}
    assert j["env"]["OPENAI_BASE_URL"] == "http://127.0.0.1:8123/v1"


def test_tokens_are_signed_with_task_and_harness_tags():
    """Each job's API key is a token the proxy accepts, carrying its session and its {task,
    harness, sample} tags."""
    for j in _plan():
        key = (
            j["env"].get("OPENAI_API_KEY")
            or j["workspace"]["files"][".claw_harness/openclaw.json5"]
            .split('apiKey: "')[1]
            .split('"')[0]
        )
        session, tags = verify_token(key, KEY)
        assert session == j["meta"]["session"]
        assert tags == {
            "task": j["meta"]["task"],
            "harness": j["meta"]["harness"],
            "sample": str(j["meta"]["sample"]),
        }


def test_verifier_is_hidden_until_verify():
    """The verifier and hidden tests travel only in verify.files, never in the agent's workspace."""
    for j in _plan():
        ws = j["workspace"]["files"]
        assert not any(k.startswith(".claw_verify") for k in ws)
        assert ".claw_verify/verify.py" in j["verify"]["files"]
        assert j["verify"]["reward_file"] == ".claw_verify/reward.json"
        assert j["verify"]["reset"] == [".claw_verify"]  # what the agent left there goes first
    fizz = [j for j in _plan() if j["meta"]["task"] == "fix-fizzbuzz"][0]
    assert ".claw_verify/hidden_test.py" in fizz["verify"]["files"]


def test_group_by_install_model_and_threshold():
    """--group-by task+harness, --install setup, --model override, and pass thresholds in meta."""
    jobs = _plan(group_by="task+harness", install=True, model="policy-x", samples=1)
    oc = [j for j in jobs if j["meta"]["harness"] == "openclaw-anthropic"][0]
    assert oc["meta"]["group"] == "csv-to-json-people+openclaw-anthropic"
    assert oc["setup"] == ["npm install -g openclaw"]
    assert "--model claw/policy-x" in oc["command"]
    toy = plan_jobs(
        list(load_suite("claw-toy").select(["toy-short"]).tasks),
        [load_harness("claw-agent-text")],
        samples=1,
        proxy_url="http://localhost:80",
        secret=KEY,
    )
    assert toy[0]["meta"]["pass_threshold"] == 0.9 and "--no-tools" in toy[0]["command"]


def test_bad_plans_are_clear():
    """Bad proxy URL, zero samples, unknown group key: errors that say which flag."""
    with pytest.raises(PlanError, match="--proxy"):
        _plan(proxy_url="127.0.0.1:8000")
    with pytest.raises(PlanError, match="-n"):
        _plan(samples=0)
    with pytest.raises(PlanError, match="--group-by"):
        _plan(group_by="model")
    assert proxy_port("https://proxy.example") == 443


def test_long_session_ids_stay_within_the_contract():
    """Session ids are at most 128 safe characters, even for long names, and stay distinct."""
    a = session_id("r", "t" * 200, "h", 0)
    b = session_id("r", "t" * 200, "h", 1)
    assert len(a) <= 128 and a != b and set(a) <= set("abcdefghijklmnopqrstuvwxyz0123456789-_r")
