"""A small Dockerfile parser and a `.dockerignore` matcher, enough for deploy/Dockerfile.

Not a full implementation of the Dockerfile syntax: it handles line
continuations (with comment lines inside them), parser directives, the
instructions FROM/ARG/ENV/LABEL/WORKDIR/COPY/ADD/RUN/USER/EXPOSE/HEALTHCHECK/
ENTRYPOINT/CMD/STOPSIGNAL/VOLUME/SHELL, exec (JSON) and shell forms, `--flag=value`
options, and `$VAR`, `${VAR}`, `${VAR:-word}` and `${VAR:+word}` substitution in
the instructions where Docker performs it. Heredocs and a custom escape
character are not supported (the parser fails on them).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

#: Instructions whose arguments Docker substitutes build args and ENV into.
SUBSTITUTED = frozenset(
    {"ADD", "COPY", "ENV", "EXPOSE", "FROM", "LABEL", "STOPSIGNAL", "USER", "VOLUME", "WORKDIR"}
)
KNOWN = SUBSTITUTED | {
    "ARG",
    "CMD",
    "ENTRYPOINT",
    "HEALTHCHECK",
    "MAINTAINER",
    "ONBUILD",
    "RUN",
    "SHELL",
}


class DockerfileError(ValueError):
    """The Dockerfile uses something this parser does not support, or is malformed."""


@dataclass
class Instruction:
    keyword: str  # upper case
    flags: dict[str, str]  # --name=value options before the arguments
    text: str  # the arguments after the flags, continuations joined
    exec_form: list[str] | None  # the JSON array, for exec-form arguments
    line: int  # where the instruction starts (1-based)


@dataclass
class Stage:
    base: str  # the FROM image, before substitution
    name: str | None
    index: int
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None


@dataclass
class Dockerfile:
    global_args: list[Instruction]  # ARGs before the first FROM
    stages: list[Stage]

    def stage(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name or str(stage.index) == name:
                return stage
        raise KeyError(name)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """``(line number, instruction text)`` with continuations joined and comments dropped."""
    result: list[tuple[int, str]] = []
    current: list[str] = []
    start = 0
    in_directives = True
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if in_directives and re.match(r"#\s*[A-Za-z]+\s*=", stripped):
            if re.match(r"#\s*escape\s*=", stripped, re.IGNORECASE):
                raise DockerfileError(f"line {number}: the escape directive is not supported")
            continue  # a parser directive, such as # syntax=
        in_directives = False
        if not stripped or stripped.startswith("#"):
            continue  # comments and empty lines are dropped, inside continuations too
        if not current:
            start = number
        if (
            number == start
            and stripped.split(None, 1)[0].upper() in ("RUN", "COPY", "ADD")
            and re.search(r"<<-?[\"']?[A-Za-z_]", stripped)
        ):
            raise DockerfileError(f"line {number}: heredocs are not supported")
        if stripped.endswith("\\"):
            current.append(raw.rstrip()[:-1])
            continue
        current.append(raw)
        result.append((start, " ".join(part.strip() for part in current).strip()))
        current = []
    if current:
        raise DockerfileError(f"line {start}: the file ends inside a line continuation")
    return result


def _split_flags(rest: str) -> tuple[dict[str, str], str]:
    flags: dict[str, str] = {}
    while True:
        match = re.match(r"--([A-Za-z][A-Za-z0-9-]*)(?:=(\S*))?\s*", rest)
        if not match:
            return flags, rest
        flags[match.group(1)] = match.group(2) if match.group(2) is not None else "true"
        rest = rest[match.end() :]


def exec_form(text: str) -> list[str] | None:
    if not text.startswith("["):
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None  # Docker treats an invalid JSON array as the shell form
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value
    return None


def parse(text: str) -> Dockerfile:
    """Parse the text of a Dockerfile into its global ARGs and its stages."""
    global_args: list[Instruction] = []
    stages: list[Stage] = []
    for number, line in _logical_lines(text):
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword not in KNOWN:
            raise DockerfileError(f"line {number}: unknown instruction {keyword}")
        rest = rest.strip()
        flags: dict[str, str] = {}
        if keyword in ("FROM", "COPY", "ADD", "RUN", "HEALTHCHECK"):
            flags, rest = _split_flags(rest)
        instruction = Instruction(keyword, flags, rest, exec_form(rest), number)
        if keyword == "FROM":
            words = rest.split()
            name = None
            if len(words) == 3 and words[1].upper() == "AS":
                name = words[2]
            elif len(words) != 1:
                raise DockerfileError(f"line {number}: FROM IMAGE [AS NAME] expected")
            stages.append(Stage(base=words[0], name=name, index=len(stages)))
        elif not stages:
            if keyword != "ARG":
                raise DockerfileError(f"line {number}: {keyword} before the first FROM")
            global_args.append(instruction)
        else:
            stages[-1].instructions.append(instruction)
    if not stages:
        raise DockerfileError("no FROM instruction")
    return Dockerfile(global_args, stages)


def parse_file(path: Path) -> Dockerfile:
    return parse(path.read_text(encoding="utf-8"))


_VARIABLE = re.compile(
    r"\\(\$)|\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?::(?P<op>[-+])(?P<word>[^}]*))?\}"
    r"|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))"
)


def substitute(text: str, variables: Mapping[str, str]) -> str:
    """Docker's variable substitution: ``$A``, ``${A}``, ``${A:-word}``, ``${A:+word}``;
    an unset variable is empty, ``\\$`` is a literal dollar."""

    def replace(match: re.Match[str]) -> str:
        if match.group(1):
            return "$"
        name = match.group("braced") or match.group("plain")
        value = variables.get(name, "")
        op = match.group("op")
        if op == "-":
            return value or substitute(match.group("word"), variables)
        if op == "+":
            return substitute(match.group("word"), variables) if value else ""
        return value

    return _VARIABLE.sub(replace, text)


def parse_key_values(text: str, variables: Mapping[str, str]) -> dict[str, str]:
    """The pairs of an ENV or LABEL instruction (``K=V ...`` or the old ``K V``),
    with variables substituted from ``variables`` (the values before the instruction)."""
    if "=" not in text.split(None, 1)[0]:
        key, _, value = text.partition(" ")
        return {key: substitute(value.strip(), variables)}
    pairs: dict[str, str] = {}
    for word in shlex.split(substitute_outside_single_quotes(text, variables)):
        key, sep, value = word.partition("=")
        if not sep:
            raise DockerfileError(f"expected KEY=VALUE, got {word!r}")
        pairs[key] = value
    return pairs


def substitute_outside_single_quotes(text: str, variables: Mapping[str, str]) -> str:
    """:func:`substitute`, except inside single quotes (as Docker does for ENV)."""
    parts = re.split(r"('[^']*')", text)
    return "".join(p if p.startswith("'") else substitute(p, variables) for p in parts)


def arg_definition(instruction: Instruction) -> tuple[str, str | None]:
    """``ARG NAME[=default]`` -> ``(NAME, default or None)``."""
    name, sep, default = instruction.text.partition("=")
    return name.strip(), (default.strip().strip('"') if sep else None)


# ---------------------------------------------------------------- .dockerignore


@dataclass(frozen=True)
class IgnorePattern:
    regex: re.Pattern[str]
    exclude: bool  # False for a "!" exception
    text: str


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go filepath.Match syntax plus ``**``) as a regex."""
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):
                i += 1
                out.append("(?:.*/)?")  # any number of directories, none included
            else:
                out.append(".*")
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                raise DockerfileError(f"bad .dockerignore pattern {pattern!r}")
            body = pattern[i + 1 : end]
            if body.startswith("^"):
                body = "!" + body[1:]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end
        elif c == "\\" and i + 1 < len(pattern):
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out))


def parse_dockerignore(text: str) -> list[IgnorePattern]:
    patterns = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exclude = not line.startswith("!")
        if not exclude:
            line = line[1:].strip()
        cleaned = str(PurePosixPath("/" + line)).lstrip("/") or "."
        patterns.append(IgnorePattern(_pattern_regex(cleaned), exclude, raw.strip()))
    return patterns


def is_ignored(relative: str, patterns: list[IgnorePattern]) -> bool:
    """Whether the context path ``relative`` (posix, relative to the context root)
    is left out of the build context: the last pattern matching the path or one
    of its parent directories decides."""
    parts = PurePosixPath(relative).parts
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    ignored = False
    for pattern in patterns:
        if any(pattern.regex.fullmatch(candidate) for candidate in candidates):
            ignored = pattern.exclude
    return ignored
