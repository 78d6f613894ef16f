"""Dockerfile ENV / ARG / WORKDIR / COPY read as Docker reads them: expansion, forms, stages."""

from __future__ import annotations

from pathlib import Path

import pytest
from _bench_schemas import validate
from claw_bench import TaskError, load_harbor_task, load_harness, plan_jobs
from claw_bench._dockerfile import DEFAULT_PATH, expand, instructions
from claw_bench.harbor import read_dockerfile


def _read(tmp_path: Path, text: str, **kw) -> tuple[str, dict, dict, list]:
    ctx = tmp_path / "environment"
    ctx.mkdir(exist_ok=True)
    (ctx / "Dockerfile").write_text(text)
    return read_dockerfile(ctx, "task t", **kw)


def test_env_path_extends_the_base_images_default_path(tmp_path):
    """`ENV PATH="/opt/x/bin:${PATH}"` on an image this reader does not know becomes
    /opt/x/bin before Docker's default PATH, never the literal text."""
    _, env, _, _ = _read(tmp_path, 'FROM some/image:1\nENV PATH="/opt/x/bin:${PATH}"\n')
    assert env == {"PATH": f"/opt/x/bin:{DEFAULT_PATH}"}
    assert DEFAULT_PATH == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    _, env, _, _ = _read(tmp_path, "FROM img\nENV TOOL=/opt/t\nENV PATH=$TOOL/bin:$PATH\n")
    assert env == {"TOOL": "/opt/t", "PATH": f"/opt/t/bin:{DEFAULT_PATH}"}


@pytest.mark.parametrize(
    ("word", "want"),
    [
        ("$A", "a"),
        ("${A}x", "ax"),
        ("$A$B", "a"),  # B unset: empty
        ("${B:-dflt}", "dflt"),
        ("${E:-dflt}", "dflt"),  # empty counts as unset with the colon
        ("${E-dflt}", ""),  # ... and as set without it
        ("${B-dflt}", "dflt"),
        ("${A:-dflt}", "a"),
        ("${A:+alt}", "alt"),
        ("${E:+alt}", ""),
        ("${E+alt}", "alt"),
        ("${B:+alt}", ""),
        ("${B:-${A}/sub}", "a/sub"),  # the default is a word of its own
        (r"\$A", "$A"),  # an escaped dollar is literal
        (r"\\$A", "\\a"),
        ("'$A ${A}'", "$A ${A}"),  # single quotes: no expansion
        ('"$A b"', "a b"),
        (r'"say \"$A\" \$A \x"', r'say "a" $A \x'),  # in double quotes \ escapes only " $ \
        ("a$", "a$"),  # a dollar before no name stays
        ("$1x", "x"),
        ("${P#*/}", "usr/local/bin"),  # BuildKit's glob prefix / suffix removal
        ("${P##*/}", "bin"),
        ("${P%/*}", "/usr/local"),
        ("${P%%/l*}", "/usr"),
        ("${P#nomatch}", "/usr/local/bin"),
        ("${B%x}", ""),
    ],
)
def test_expansion_follows_dockers_shell_lexer(word, want):
    """Each of Docker's substitution forms, quotes and escapes."""
    assert expand(word, {"A": "a", "E": "", "P": "/usr/local/bin"}) == want


def test_env_forms_quotes_continuations_and_one_instruction_one_scope(tmp_path):
    """`ENV k=v k2=v2` (every pair sees the environment before the line, as in Docker), legacy
    `ENV k v w`, quotes, an escaped space, and continuation lines joined as Docker joins them."""
    text = (
        "FROM base\n"
        "ENV A=1\n"
        'ENV A=2 B=$A C="two words" D=one\\ two\n'
        "ENV LEGACY  value with   $A\n"
        "ENV PATH=/a/bin:$PATH \\\n"
        "    # a comment between continuation lines\n"
        "    LANG=C.UTF-8 JOINED=x\\\n"
        "y\n"
    )
    _, env, _, _ = _read(tmp_path, text)
    assert env == {
        "A": "2",
        "B": "1",
        "C": "two words",
        "D": "one two",
        "LEGACY": "value with   2",
        "PATH": f"/a/bin:{DEFAULT_PATH}",
        "LANG": "C.UTF-8",
        "JOINED": "xy",
    }


def test_arg_defaults_build_args_globals_and_env_over_arg(tmp_path):
    """ARG defaults expand; a build arg overrides the default; a global ARG (before FROM) names
    the image and reaches a stage that re-declares it; ENV of the same name wins over ARG; an
    ARG is not in the image's environment."""
    text = (
        "ARG VERSION=1.2\n"
        "ARG PREFIX=/opt\n"
        "FROM tool:${VERSION} AS base\n"
        "ARG VERSION\n"
        "ARG PREFIX\n"
        "ARG HOME_DIR=$PREFIX/tool-$VERSION\n"
        "ARG UNSET\n"
        "ENV TOOL_HOME=$HOME_DIR PATH=${HOME_DIR}/bin:${PATH} U=${UNSET:-none}\n"
        "ARG TOOL_HOME=/ignored\n"
        "ENV SEEN=$TOOL_HOME\n"
    )
    _, env, _, _ = _read(tmp_path, text)
    assert env == {
        "TOOL_HOME": "/opt/tool-1.2",
        "PATH": f"/opt/tool-1.2/bin:{DEFAULT_PATH}",
        "U": "none",
        "SEEN": "/opt/tool-1.2",
    }
    _, env, _, _ = _read(tmp_path, text, build_args={"VERSION": "9", "UNSET": "given"})
    assert env["TOOL_HOME"] == "/opt/tool-9" and env["U"] == "given"


def test_stages_reset_the_environment_and_only_the_final_stage_counts(tmp_path):
    """FROM starts over (the base's default PATH, the default workdir); FROM an earlier stage
    inherits its ENV and WORKDIR; an earlier stage's COPY is not a workspace file."""
    ctx = tmp_path / "environment"
    ctx.mkdir()
    (ctx / "a.txt").write_text("a\n")
    text = (
        "FROM builder:1 AS build\n"
        "WORKDIR /app\n"
        "ENV PATH=/build/bin:$PATH ONLY_BUILD=1\n"
        "COPY a.txt ./\n"
        "FROM runtime:1\n"
        "ENV SEEN=${ONLY_BUILD:-reset} PATH=/rt/bin:$PATH\n"
    )
    workdir, env, files, skipped = _read(tmp_path, text)
    assert env == {"SEEN": "reset", "PATH": f"/rt/bin:{DEFAULT_PATH}"}
    assert (workdir, files, skipped) == ("/app", {}, ["COPY a.txt ./"])
    text = "FROM b:1 AS base\nENV BASE=/srv\nWORKDIR $BASE/app\nFROM base\nENV P=$BASE/x\nCOPY a.txt .\n"
    workdir, env, files, _ = _read(tmp_path, text)
    assert (workdir, env, files) == ("/srv/app", {"BASE": "/srv", "P": "/srv/x"}, {"a.txt": "a\n"})


def test_heredoc_bodies_belong_to_their_instruction(tmp_path):
    """A RUN heredoc's lines are not read as instructions of their own."""
    text = "FROM b\nRUN <<EOF\nENV X=1\necho hi\nEOF\nENV Y=2\n"
    _, env, _, skipped = _read(tmp_path, text)
    assert env == {"Y": "2"} and skipped == ["RUN <<EOF ENV X=1 echo hi EOF"]
    assert [n for n, _ in instructions(text)] == [1, 2, 6]


def test_dockerfile_errors_name_file_and_line(tmp_path):
    """A word Docker rejects (a required variable unset, an unterminated quote) or one this
    reader cannot expand is a TaskError with the Dockerfile and its line."""
    for text, msg in [
        ('FROM b\nENV A="${NEED:?set NEED}"\n', r"Dockerfile: line 2: NEED: set NEED"),
        ('FROM b\n\nENV A="open\n', r"Dockerfile: line 3: unterminated \" quote"),
        ("FROM b\nENV A=${B/x/y}\n", r"line 2: unsupported substitution"),
        ("ENV A=1\n", r"no FROM instruction"),
    ]:
        with pytest.raises(TaskError, match=msg):
            _read(tmp_path, text)


def test_harbor_task_env_is_expanded(tmp_path):
    """A Harbor task's jobs carry the Dockerfile's expanded ENV as ``image_env`` (a backend that
    runs no image sets it; docker has it from the image); [environment.env] is the job's env,
    which wins over it."""
    d = tmp_path / "t"
    (d / "tests").mkdir(parents=True)
    (d / "environment").mkdir()
    (d / "instruction.md").write_text("do it\n")
    (d / "tests" / "test.sh").write_text("true\n")
    (d / "environment" / "Dockerfile").write_text(
        'FROM x\nENV PATH="/opt/x/bin:${PATH}" HOME_X=~/x\n'
    )
    (d / "task.toml").write_text('[environment.env]\nHOME_X = "/root/x"\n')
    t = load_harbor_task(d)
    image_env = {"PATH": f"/opt/x/bin:{DEFAULT_PATH}", "HOME_X": "~/x"}
    assert t.meta["harbor"]["image_env"] == image_env and t.meta["env"] == {"HOME_X": "/root/x"}
    (job,) = plan_jobs([t], [load_harness("oracle")], samples=1)
    validate(job, "job")
    assert job["image_env"] == image_env and job["env"]["HOME_X"] == "/root/x"


# every form above in one Dockerfile (the colon-less ${V-d} / ${V+x} only BuildKit knows: left out)
REFERENCE = r"""ARG VERSION=1.2
ARG BASE=claw-bench-fixture/base:1
FROM ${BASE} AS first
ARG VERSION
ARG PREFIX=/opt
ARG HOME_DIR=$PREFIX/tool-$VERSION
ENV A=1
ENV A=2 B=$A C="two words" D=one\ two E='single $A' F="dq \$A \"q\"" G=${UNSET:-dflt} H=${A:+alt}
ENV LEGACY  value with   $A
ENV PATH=/a/bin:$PATH \
    LANG=C.UTF-8 JOINED=x\
y
ENV TOOL_HOME=$HOME_DIR PATH="${HOME_DIR}/bin:${PATH}"
ENV EMPTY=
ENV J=${EMPTY:-e1} L=${EMPTY:+p} N=a$ O=$1x P=\\$A
FROM first
ENV Q=$TOOL_HOME/q
"""


@pytest.mark.slow
def test_env_matches_what_docker_build_gives(tmp_path):
    """The reference: `docker build` of a Dockerfile with every form, its image's Config.Env
    against what this reader says (the base image has no ENV: Docker's default PATH)."""
    import json
    import subprocess

    from _fixture_image import BASE_IMAGE, ensure_base_image

    why = ensure_base_image()
    if why:
        pytest.skip(f"no local base image to build on: {why}")
    assert BASE_IMAGE in REFERENCE
    ctx = tmp_path / "environment"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(REFERENCE)
    tag = "claw-bench-test/dockerfile-env:1"
    p = subprocess.run(
        ["docker", "build", "-q", "-t", tag, str(ctx)], capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr
    try:
        out = subprocess.run(
            ["docker", "image", "inspect", "--format", "{{json .Config.Env}}", tag],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    finally:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)
    built = dict(e.split("=", 1) for e in json.loads(out))
    _, env, _, _ = read_dockerfile(ctx, "task t")
    assert env == built
    assert built["PATH"] == f"/opt/tool-1.2/bin:/a/bin:{DEFAULT_PATH}" and built["P"] == "\\2"
