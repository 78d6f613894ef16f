"""The LLM judge: request shapes (OpenAI, Anthropic), score parsing, hybrid rewards, not_scorable without a judge."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from claw_bench import load_suite
from claw_bench.loaders.judge import (
    Judge,
    JudgeError,
    apply_judge,
    judge_prompt,
    parse_score,
    workspace_files,
)
from test_public_e2e import PUBLIC, run_task, solution

PB = PUBLIC / "pinchbench" / "tasks"


class Recorder:
    """A MockTransport handler answering in the OpenAI or Anthropic shape and keeping the requests."""

    def __init__(self, answer: str, status: int = 200):
        self.answer, self.status, self.requests = answer, status, []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests.append((request.url.path, dict(request.headers), body))
        if self.status != 200:
            return httpx.Response(self.status, text="upstream overloaded")
        if request.url.path.endswith("/messages"):
            return httpx.Response(
                200, json={"type": "message", "content": [{"type": "text", "text": self.answer}]}
            )
        return httpx.Response(
            200, json={"choices": [{"message": {"role": "assistant", "content": self.answer}}]}
        )


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ('{"score": 0.75, "reasoning": "ok"}', 0.75),
        ('Thinking... {"a": 1} then {"score": "0.5", "reasoning": "meh"}', 0.5),
        ("Score: 3/4", 0.75),
        ("final score = 1", 1.0),
    ],
)
def test_parse_score(text, score):
    """The last JSON object with a score wins; 'score: x' and 'x/y' forms are understood."""
    assert parse_score(text) == pytest.approx(score)


@pytest.mark.parametrize("text", ['{"score": 7}', "I liked it.", "score: 12"])
def test_parse_score_refuses_garbage(text):
    """Answers without a score in [0, 1] raise JudgeError quoting the answer."""
    with pytest.raises(JudgeError):
        parse_score(text)


def test_openai_and_anthropic_requests_carry_rubric_instruction_and_files():
    """Both APIs get the instruction, the rubric and the workspace files; keys go in the right header."""
    files = {
        "RELEASE.md": "# 1.2\n- fix",
        ".claw_verify/grade.py": "secret",
        ".claw_harness/instruction.md": "x",
    }
    for api, path, header in (
        ("openai", "/v1/chat/completions", "authorization"),
        ("anthropic", "/v1/messages", "x-api-key"),
    ):
        rec = Recorder('{"score": 0.5, "reasoning": "half"}')
        j = Judge(
            base_url="http://judge.test/v1",
            model="m",
            api=api,
            api_key="k1",
            transport=httpx.MockTransport(rec),
        )
        score, raw = j.grade(
            instruction="Write RELEASE.md",
            rubric="Score 1 when clear",
            files=workspace_files(files),
        )
        assert (score, raw) == (0.5, '{"score": 0.5, "reasoning": "half"}')
        got_path, headers, body = rec.requests[0]
        assert got_path == path and "k1" in headers[header] and body["model"] == "m"
        text = json.dumps(body)
        assert (
            "Write RELEASE.md" in text
            and "Score 1 when clear" in text
            and 'FILE \\"RELEASE.md\\"' in text
        )
        assert "secret" not in text and "instruction.md" not in text


def test_judge_http_errors_are_named():
    """A failing endpoint raises JudgeError naming the request and status."""
    j = Judge(
        base_url="http://judge.test/v1",
        model="m",
        transport=httpx.MockTransport(Recorder("", status=503)),
    )
    with pytest.raises(
        JudgeError,
        match=r"POST http://judge\.test/v1/chat/completions: HTTP 503: upstream overloaded",
    ):
        j.ask("hi")
    with pytest.raises(JudgeError, match="judge api must be one of"):
        Judge(base_url="http://x", model="m", api="gemini")


def test_prompt_truncates_large_workspaces():
    """Big files are cut and the prompt stays bounded."""
    p = judge_prompt("i", "r", {f"f{i}.txt": "x" * 50_000 for i in range(10)})
    assert len(p) < 150_000 and "more characters cut" in p and "more files left out" in p


def _judge(score: float) -> tuple[Judge, Recorder]:
    rec = Recorder(f'Looks fine.\n{{"score": {score}, "reasoning": "because"}}')
    return Judge(
        base_url="http://judge.test/v1", model="judge-m", transport=httpx.MockTransport(rec)
    ), rec


def test_hybrid_without_judge_is_not_scorable_never_failed(tmp_path):
    """PinchBench hybrid / llm_judge and ClawGym hybrid tasks without a judge: status not_scorable, reward null."""
    for suite, tid in (
        (PB, "task_02_release_note"),
        (PB, "task_03_haiku"),
        (PUBLIC / "clawgym", "cg-meeting-notes"),
    ):
        task = load_suite(suite).get(tid)
        out = run_task(task, tmp_path, solution(task))
        assert (out["status"], out["reward"], out["passed"]) == ("not_scorable", None, None)
        assert "needs an LLM judge" in out["error"]


def test_hybrid_reward_is_weighted_and_judge_answer_recorded(tmp_path):
    """reward = w_auto x grade() + w_judge x judge; the judge's score, raw answer and model are in details."""
    task = load_suite(PB).get("task_02_release_note")
    judge, rec = _judge(0.5)
    out = run_task(task, tmp_path, solution(task), judge=judge)
    d = out["details"]
    assert (
        out["status"] == "ok"
        and out["reward"] == pytest.approx(0.6 * 1.0 + 0.4 * 0.5)
        and out["passed"] is False
    )
    assert (d["judge_score"], d["judge_model"], d["automated_score"]) == (0.5, "judge-m", 1.0)
    assert '"reasoning": "because"' in d["judge_raw"] and d["heading"] == 1.0
    assert "Fixed a crash on empty input" in json.dumps(rec.requests[0][2])
    half = run_task(task, tmp_path, "printf '# 1.2\\n' > RELEASE.md", judge=_judge(1.0)[0])
    assert half["reward"] == pytest.approx(0.6 * 0.5 + 0.4 * 1.0)
    assert (
        run_task(task, tmp_path, solution(task), judge=_judge(0.5)[0], threshold=0.8)["passed"]
        is True
    )


def test_judge_failure_is_infra_error_not_zero(tmp_path):
    """An unreachable judge or one without a score makes the outcome infra_error, with the reason."""
    task = load_suite(PB).get("task_03_haiku")
    bad = Judge(
        base_url="http://judge.test/v1",
        model="m",
        transport=httpx.MockTransport(Recorder("no idea")),
    )
    out = run_task(task, tmp_path, solution(task), judge=bad)
    assert (out["status"], out["reward"]) == ("infra_error", None) and "holds no score" in out[
        "error"
    ]


def test_apply_judge_leaves_unscored_runs_alone():
    """Runs that already failed as infra errors are not sent to the judge."""
    out = {"status": "infra_error", "reward": None, "passed": None}
    assert apply_judge(dict(out), {}, {"rubric": "r"}, None, None) == out


def test_judge_through_a_real_loopback_server(tmp_path):
    """The judge over real HTTP (an in-process OpenAI-shaped server on loopback)."""
    from bench_testlib import ModelServer

    seen = []

    def policy(tags, turn, body):
        seen.append(body)
        return {"text": '{"score": 1, "reasoning": "a fine haiku"}'}

    with ModelServer(policy) as srv:
        from bench_testlib import SECRET
        from claw_bench.token import mint_token

        judge = Judge(
            base_url=f"{srv.url}/v1", model="judge", api_key=mint_token("judge", SECRET, {})
        )
        task = load_suite(PB).get("task_03_haiku")
        out = run_task(task, tmp_path, solution(task), judge=judge)
    assert out["reward"] == 1.0 and out["passed"] is True and "haiku.txt" in json.dumps(seen[0])
    assert Path(out["_workspace"], "haiku.txt").is_file()
