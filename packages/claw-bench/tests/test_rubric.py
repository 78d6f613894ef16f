"""Rubric chains: per-criterion binary verdicts from a scripted judge, prerequisites, weighted
reward, retries that end in infra_error (never a failed criterion), the answers cache, call ids,
rubric.json checks, and PinchBench's criterion rubrics scored through the same path."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from claw_bench import load_suite
from claw_bench.errors import ClawError
from claw_bench.loaders import Judge, JudgeCache
from claw_bench.loaders.pinchbench import load_pinchbench_task
from claw_bench.loaders.rubric import (
    RubricError,
    apply_rubric_chain,
    chain_reward,
    load_rubric_file,
    parse_criteria,
    parse_verdict,
    pinchbench_criteria,
)
from claw_bench.score import score_run
from claw_bench.tasks import load_task
from test_public_e2e import run_task

FIX = Path(__file__).parent / "fixtures" / "rubric"
_CRIT = re.compile(r"# Criterion (\S+)\n")


class ScriptedJudge:
    """An OpenAI / Anthropic endpoint (httpx MockTransport) answering per criterion id: each id
    has a list of replies used in turn (the last repeats); an int reply is an HTTP status, a
    string the answer text. Every answer carries an ``x-claw-call-id`` header and a body ``id``."""

    def __init__(self, script: dict[str, list[str | int]]):
        self.script = script
        self.asked: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        prompt = body["messages"][-1]["content"]
        m = _CRIT.search(prompt)
        assert m, "every chain request names its criterion"
        cid = m.group(1)
        n = self.asked.count(cid)
        self.asked.append(cid)
        replies = self.script[cid]
        reply = replies[min(n, len(replies) - 1)]
        if isinstance(reply, int):
            return httpx.Response(reply, text="upstream unavailable")
        headers = {"x-claw-call-id": f"call-{cid}-{n}"}
        if request.url.path.endswith("/messages"):
            data = {"id": "msg_1", "type": "message", "content": [{"type": "text", "text": reply}]}
        else:
            data = {"id": "chatcmpl-1", "choices": [{"message": {"content": reply}}]}
        return httpx.Response(200, json=data, headers=headers)

    def judge(self, *, api: str = "openai", cache: JudgeCache | None = None) -> Judge:
        return Judge(
            base_url="http://judge.test/v1",
            model="judge-m",
            api=api,
            transport=httpx.MockTransport(self),
            backoff_s=0.0,
            cache=cache,
        )


CHAIN = [
    {"id": "a", "text": "The report exists.", "weight": 2},
    {"id": "b", "text": "The report gives the total.", "requires": ["a"]},
    {"id": "c", "text": "The report is polite."},
]


def _run(files: dict[str, str] | None = None, message: str = "done") -> dict:
    """A verified claw.run/v1 dict of a rubric-chain task (verifier reward 1)."""
    return {
        "schema": "claw.run/v1",
        "job_id": "j1",
        "status": "ok",
        "exit_code": 0,
        "verify": {"exit_code": 0, "passed": True, "reward": 1.0},
        "collected": files if files is not None else {"report.md": "total: 12"},
        "stdout_tail": message,
        "meta": {
            "session": "s1",
            "task": "t1",
            "harness": "h",
            "judge": {
                "instruction": "Write report.md",
                "grading": "rubric_chain",
                "weights": {"automated": 0.0, "llm_judge": 1.0},
                "criteria": CHAIN,
            },
        },
    }


def test_chain_scores_weighted_fraction_and_skips_what_a_failed_criterion_requires():
    """a fails, so b (requires a) is not asked and counts as failed; c passes: reward (0·2 + 0 +
    1) / 4; every verdict carries its call id."""
    sj = ScriptedJudge({"a": ['{"verdict": "NO", "reason": "no file"}'], "c": ["YES"]})
    out = score_run(_run(), judge=sj.judge())
    assert out["status"] == "ok" and sj.asked == ["a", "c"]
    crit = {v["id"]: v for v in out["details"]["criteria"]}
    assert crit["a"]["verdict"] == "fail" and crit["a"]["reason"] == "no file"
    assert crit["b"] == {
        "id": "b",
        "verdict": "skipped",
        "score": 0.0,
        "weight": 1.0,
        "reason": "skipped: requires a",
        "call_id": None,
        "cached": False,
    }
    assert crit["c"]["verdict"] == "pass" and crit["c"]["call_id"] == "call-c-0"
    assert out["reward"] == pytest.approx(0.25) and out["passed"] is False
    assert out["details"]["rubric_score"] == pytest.approx(0.25)


def test_all_criteria_pass_through_the_anthropic_api():
    """Every criterion YES (bare, with a full stop, or fenced JSON): reward 1 and passed; the
    call ids come from claw-proxy's x-claw-call-id header."""
    sj = ScriptedJudge({"a": ["YES"], "b": ["yes."], "c": ['```json\n{"verdict": "YES"}\n```']})
    out = score_run(_run(), judge=sj.judge(api="anthropic"))
    assert (out["reward"], out["passed"]) == (1.0, True)
    assert [v["call_id"] for v in out["details"]["criteria"]] == [
        "call-a-0",
        "call-b-0",
        "call-c-0",
    ]


def test_infra_errors_are_retried_and_then_infra_error_never_a_failed_criterion():
    """A 503 then an answer: asked twice, passes. A criterion that never gets a usable answer
    (5xx, unparsable) makes the outcome infra_error with reward null, naming the criterion."""
    sj = ScriptedJudge({"a": [503, "maybe", "YES"], "b": ["YES"], "c": ["NO"]})
    out = score_run(_run(), judge=sj.judge())
    assert out["status"] == "ok" and sj.asked.count("a") == 3
    assert out["reward"] == pytest.approx(3 / 4)
    down = ScriptedJudge({"a": ["YES"], "b": [502, "I think so", 500], "c": ["YES"]})
    out = score_run(_run(), judge=down.judge())
    assert (out["status"], out["reward"], out["passed"]) == ("infra_error", None, None)
    assert down.asked.count("b") == 3 and "criterion b" in out["error"]
    assert [v["id"] for v in out["details"]["criteria"]] == ["a"]  # what was judged is kept


def test_a_refused_request_is_infra_error_without_retries():
    """HTTP 401 (a wrong key) is not retried, and is still infra_error, not a failed criterion."""
    sj = ScriptedJudge({"a": [401]})
    out = score_run(_run(), judge=sj.judge())
    assert out["status"] == "infra_error" and sj.asked == ["a"] and "HTTP 401" in out["error"]


def test_cached_answers_are_not_asked_again_until_the_evidence_changes(tmp_path):
    """Scoring again with the same cache file asks nothing; other evidence asks again."""
    path = tmp_path / "judge-cache.jsonl"
    sj = ScriptedJudge({"a": ["YES"], "b": ["NO"], "c": ["YES"]})
    first = score_run(_run(), judge=sj.judge(cache=JudgeCache(path)))
    assert len(sj.asked) == 3 and len(path.read_text().splitlines()) == 3
    again = score_run(_run(), judge=sj.judge(cache=JudgeCache(path)))
    assert len(sj.asked) == 3  # nothing asked
    assert again["reward"] == first["reward"] == pytest.approx(3 / 4)
    assert all(v["cached"] for v in again["details"]["criteria"])
    assert [v["call_id"] for v in again["details"]["criteria"]] == [
        "call-a-0",
        "call-b-0",
        "call-c-0",
    ]
    score_run(_run(message="other final message"), judge=sj.judge(cache=JudgeCache(path)))
    assert len(sj.asked) == 6


def test_infra_errors_are_not_cached(tmp_path):
    """A criterion that got no answer is asked again on the next scoring."""
    path = tmp_path / "cache.jsonl"
    sj = ScriptedJudge({"a": [503], "b": ["YES"], "c": ["YES"]})
    assert score_run(_run(), judge=sj.judge(cache=JudgeCache(path)))["status"] == "infra_error"
    assert not path.exists()
    sj.script["a"] = ["YES"]
    assert score_run(_run(), judge=sj.judge(cache=JudgeCache(path)))["reward"] == 1.0


def test_a_broken_cache_line_is_named(tmp_path):
    """A cache line without a key is an error naming the file and line, not a silent miss."""
    path = tmp_path / "cache.jsonl"
    path.write_text('{"key": "k1", "score": 1.0, "call_id": null}\n{"score": 0}\n')
    with pytest.raises(ClawError, match=r"cache\.jsonl:2: judge cache line needs a string 'key'"):
        JudgeCache(path).get("k1")
    assert JudgeCache(tmp_path / "absent.jsonl").get("k1") is None


@pytest.mark.parametrize(
    ("text", "scale", "score"),
    [
        ("YES", "binary", 1.0),
        ("no.", "binary", 0.0),
        ('{"verdict": "NO", "reason": "r"}', "binary", 0.0),
        ('{"score": 0.75}', "graded", 0.75),
        ("0.5", "graded", 0.5),
    ],
)
def test_parse_verdict_accepts_strict_answers(text, scale, score):
    """YES / NO, a JSON verdict, a JSON score or a bare number: nothing looser."""
    assert parse_verdict(text, scale)[0] == score


@pytest.mark.parametrize(
    ("text", "scale"),
    [
        ("Yes, mostly", "binary"),
        ('{"verdict": "maybe"}', "binary"),
        ("I would say YES", "binary"),
        ('{"score": 2}', "graded"),
        ("YES", "graded"),
    ],
)
def test_parse_verdict_refuses_loose_answers(text, scale):
    """Anything else is unparsable (and so retried), never read as a verdict."""
    with pytest.raises(Exception, match="unparsable judge answer") as info:
        parse_verdict(text, scale)
    assert info.value.retryable


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([], "field 'criteria' must be a non-empty list"),
        ([{"id": "a", "text": "t", "extra": 1}], r"criteria\[0\]: unknown field\(s\) \['extra'\]"),
        ([{"id": "a", "text": ""}], r"criteria\[0\]\.text: must be a non-empty string"),
        ([{"id": "a", "text": "t"}, {"id": "a", "text": "u"}], r"criteria\[1\]\.id 'a' repeats"),
        ([{"id": "a", "text": "t", "requires": ["z"]}], "'z' is not another criterion's id"),
        ([{"id": "a", "text": "t", "weight": 0}], r"criteria\[0\]\.weight: must be a positive"),
        (
            [
                {"id": "a", "text": "t", "requires": ["b"]},
                {"id": "b", "text": "u", "requires": ["a"]},
            ],
            r"form a cycle among \['a', 'b'\]",
        ),
        (
            [
                {"id": "a", "text": "t", "scale": "graded"},
                {"id": "b", "text": "u", "requires": ["a"]},
            ],
            "'a' is graded; only binary criteria can be required",
        ),
    ],
)
def test_malformed_chains_are_named(items, message):
    """Errors name the place, the criterion's index and the field."""
    with pytest.raises(RubricError, match=message):
        parse_criteria(items, "rubric.json")


def test_requirements_order_the_chain():
    """A criterion listed before the one it requires is judged after it."""
    crits = parse_criteria(
        [{"id": "late", "text": "t", "requires": ["base"]}, {"id": "base", "text": "u"}], "x"
    )
    assert [c.id for c in crits] == ["base", "late"]


def test_claw_task_declares_its_chain_in_rubric_json(tmp_path):
    """rubric.json becomes the task's judge spec and its evidence globs are collected; a bad
    rubric.json fails the load naming the file and the field."""
    task = load_task(FIX / "claw-memo")
    spec = task.meta["judge"]
    assert [c["id"] for c in spec["criteria"]] == ["exists", "decisions", "no_noise"]
    assert spec["weights"] == {"automated": 0.0, "llm_judge": 1.0}
    assert task.meta["collect"] == ["memo.md", "notes.txt"]
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("task.toml", "verify.sh"):
        (bad / name).write_text((FIX / "claw-memo" / name).read_text())
    (bad / "rubric.json").write_text('{"criteria": [{"id": "a", "text": "t", "weight": -1}]}')
    with pytest.raises(Exception, match=r"bad/rubric\.json: criteria\[0\]\.weight"):
        load_task(bad)
    (bad / "rubric.json").write_text('{"criteria": [{"id": "a", "text": "t"}], "evidence": "*"}')
    with pytest.raises(Exception, match=r"rubric\.json: field 'evidence' must be a non-empty list"):
        load_rubric_file(bad / "rubric.json", "i")


def test_claw_task_rubric_chain_end_to_end(tmp_path):
    """The reference solution, run in the test sandbox and scored by the scripted judge: the
    judge sees memo.md and the final message; no_noise fails, so reward (1 + 2) / 4."""
    task = load_task(FIX / "claw-memo")
    seen: list[str] = []
    sj = ScriptedJudge({"exists": ["YES"], "decisions": ["YES"], "no_noise": ["NO"]})

    def spy(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content)["messages"][-1]["content"])
        return sj(request)

    judge = Judge(base_url="http://judge.test/v1", model="m", transport=httpx.MockTransport(spy))
    out = run_task(task, tmp_path, task.solution.text, judge=judge)
    assert out["status"] == "ok" and out["reward"] == pytest.approx(0.75)
    assert re.search(r'^\[\w+\] FILE "memo\.md"\n# Memo', seen[0], re.M)
    assert re.search(r"^\[\w+\] FINAL MESSAGE\n.*memo\.md written", seen[0], re.M | re.S)


def test_pinchbench_criterion_rubrics_are_judged_criterion_by_criterion(tmp_path):
    """A PinchBench rubric of '### Criterion N: Name (Weight: W%)' sections goes through the
    chain: one graded question per criterion, weighted; hybrid blends it with grade()."""
    task = load_pinchbench_task(FIX / "pinchbench" / "tasks" / "task_04_changelog.md")
    crits = task.meta["judge"]["criteria"]
    assert [(c["id"], c["weight"], c["scale"]) for c in crits] == [
        ("criterion_1", 75.0, "graded"),
        ("criterion_2", 25.0, "graded"),
    ]
    assert crits[0]["text"].startswith("Completeness\n\n**Score 1.0**")
    sj = ScriptedJudge({"criterion_1": ['{"score": 0.5}'], "criterion_2": ['{"score": 1}']})
    cmd = "printf '# 2.0\\n- new export command\\n' > CHANGELOG.md"
    out = run_task(task, tmp_path, cmd, judge=sj.judge())
    assert out["status"] == "ok" and sorted(sj.asked) == ["criterion_1", "criterion_2"]
    rubric = (0.5 * 75 + 1.0 * 25) / 100
    assert out["details"]["rubric_score"] == pytest.approx(rubric)
    assert out["reward"] == pytest.approx(0.4 * 1.0 + 0.6 * rubric)
    assert [v["verdict"] for v in out["details"]["criteria"]] == ["scored", "scored"]


def test_pinchbench_holistic_rubrics_keep_the_whole_rubric_judge():
    """The fixtures' one-paragraph rubrics are no criterion list: judged whole, as before."""
    suite = load_suite(str(Path(__file__).parent / "fixtures" / "public" / "pinchbench" / "tasks"))
    judged = [t for t in suite.tasks if "judge" in t.meta]
    assert judged and all("criteria" not in t.meta["judge"] for t in judged)
    assert pinchbench_criteria("Score 1 when the note is clear.") is None


def test_no_judge_means_not_scorable_and_chain_reward_of_nothing():
    """Without a judge a chain task is not_scorable (never failed); an empty chain scores 0."""
    out = apply_rubric_chain(
        {"status": "ok", "reward": 1.0}, _run(), _run()["meta"]["judge"], None, None
    )
    assert out["status"] == "not_scorable" and "needs an LLM judge" in out["error"]
    assert chain_reward([]) == 0.0


def test_cli_score_asks_a_real_endpoint_once_per_criterion_and_caches_next_to_the_runs(tmp_path):
    """`claw-bench score RUNS --judge-url` over loopback HTTP: one request per criterion, the
    verdicts in the outcome, the cache at RUNS.judge-cache.jsonl; scoring again asks nothing."""
    from bench_testlib import SECRET, ModelServer
    from claw_bench.cli import main
    from claw_bench.token import mint_token
    from click.testing import CliRunner

    asked: list[str] = []

    def policy(tags, turn, body):
        cid = _CRIT.search(json.dumps(body).replace("\\n", "\n")).group(1)
        asked.append(cid)
        return {"text": "NO" if cid == "a" else "YES"}

    runs = tmp_path / "runs.jsonl"
    runs.write_text(json.dumps(_run()) + "\n")
    with ModelServer(policy) as srv:
        args = ["score", str(runs), "--judge-url", f"{srv.url}/v1", "--judge-model", "j"]
        args += ["--judge-key-env", "JUDGE_KEY"]
        env = {"JUDGE_KEY": mint_token("judge", SECRET, {})}
        first = CliRunner().invoke(main, args, env=env)
        assert first.exit_code == 0, first.output
        second = CliRunner().invoke(main, args, env=env)
    assert asked == ["a", "c"]  # b requires a, which failed; the second scoring asked nothing
    out = json.loads(second.stdout.splitlines()[0])
    assert [v["verdict"] for v in out["details"]["criteria"]] == ["fail", "skipped", "pass"]
    assert out["reward"] == pytest.approx(0.25)
    assert len((tmp_path / "runs.jsonl.judge-cache.jsonl").read_text().splitlines()) == 2


def test_without_the_proxy_header_the_call_id_is_the_response_id():
    """A judge that is no claw-proxy (no x-claw-call-id) is linked by its response's id."""

    def plain(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, json={"id": "chatcmpl-42", "choices": [{"message": {"content": "YES"}}]}
        )

    judge = Judge(base_url="http://judge.test/v1", model="m", transport=httpx.MockTransport(plain))
    out = score_run(_run(), judge=judge)
    assert [v["call_id"] for v in out["details"]["criteria"]] == ["chatcmpl-42"] * 3
