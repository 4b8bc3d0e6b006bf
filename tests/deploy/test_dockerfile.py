"""deploy/Dockerfile and .dockerignore: static checks, and the Dockerfile's steps
run as a script on this machine (there is no Docker engine here)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from broker.config import load_config, parse_address

from . import dockerfile as df
from .helpers import DEPLOY, K8S, REPO, load_yaml_all, missing_tool, require_tool

DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
NOBODY = 65534
#: Commands that create the image's user; the script run skips them (see the slow test).
USER_CREATION = frozenset({"groupadd", "useradd", "addgroup", "adduser"})
#: Instructions that only describe the image; the script run reads them where needed.
INERT = frozenset(
    {"CMD", "ENTRYPOINT", "EXPOSE", "HEALTHCHECK", "LABEL", "STOPSIGNAL", "USER", "VOLUME"}
)


@pytest.fixture(scope="module")
def dockerfile() -> df.Dockerfile:
    return df.parse_file(DOCKERFILE)


def _final(dockerfile: df.Dockerfile) -> df.Stage:
    return dockerfile.stages[-1]


def _stage_variables(
    dockerfile: df.Dockerfile, stage: df.Stage, build_args: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The ARG and ENV values at the end of ``stage`` (ENV over ARG, as in RUN)."""
    build_args = dict(build_args or {})
    global_values = _global_args(dockerfile, build_args)
    args: dict[str, str] = {}
    env: dict[str, str] = {}
    for instruction in stage.instructions:
        if instruction.keyword == "ARG":
            name, default = df.arg_definition(instruction)
            value = build_args.get(name)
            if value is None:
                value = (
                    df.substitute(default, {**args, **env})
                    if default is not None
                    else global_values.get(name, "")
                )
            args[name] = value
        elif instruction.keyword == "ENV":
            env.update(df.parse_key_values(instruction.text, {**args, **env}))
    return {**args, **env}


def _global_args(dockerfile: df.Dockerfile, build_args: Mapping[str, str]) -> dict[str, str]:
    values: dict[str, str] = {}
    for instruction in dockerfile.global_args:
        name, default = df.arg_definition(instruction)
        values[name] = build_args.get(name, df.substitute(default or "", values))
    return values


def _user_creation_uid(stage: df.Stage) -> int | None:
    for run in stage.all("RUN"):
        match = re.search(r"\buseradd\b.*?--uid[= ](\d+)", run.text)
        if match:
            return int(match.group(1))
    return None


def _port(address: str) -> int:
    return parse_address(address)[1]


# ---------------------------------------------------------------- the parser itself


def test_the_parser_joins_continuations_and_substitutes_variables() -> None:
    text = (
        "# syntax=docker/dockerfile:1\n"
        "ARG BASE=python:3.11-slim\n"
        "FROM ${BASE} AS build\n"
        "ARG PREFIX=/opt/x\n"
        "ENV A=1 \\\n"
        "    # a comment inside a continuation\n"
        '    B="$PREFIX/bin:${PATH}" C=${MISSING:-dflt}\n'
        "RUN echo one \\\n"
        "    && echo two\n"
        "FROM ${BASE}\n"
        "COPY --from=build --chown=1:1 $PREFIX $PREFIX\n"
        'ENTRYPOINT ["broker", "serve"]\n'
        "HEALTHCHECK --interval=5s CMD broker health\n"
    )
    parsed = df.parse(text)
    assert [s.name for s in parsed.stages] == ["build", None]
    assert df.substitute(parsed.stages[0].base, _global_args(parsed, {})) == "python:3.11-slim"
    variables = _stage_variables(parsed, parsed.stages[0], {"PREFIX": "/tmp/p"})
    assert variables["B"] == "/tmp/p/bin:" and variables["C"] == "dflt" and variables["A"] == "1"
    run = parsed.stages[0].all("RUN")[0]
    assert run.text == "echo one && echo two" and run.line == 8
    copy = parsed.stages[1].all("COPY")[0]
    assert copy.flags == {"from": "build", "chown": "1:1"} and copy.text == "$PREFIX $PREFIX"
    assert parsed.stages[1].all("ENTRYPOINT")[0].exec_form == ["broker", "serve"]
    healthcheck = parsed.stages[1].all("HEALTHCHECK")[0]
    assert healthcheck.flags == {"interval": "5s"} and healthcheck.text == "CMD broker health"
    with pytest.raises(df.DockerfileError):
        df.parse("FROM a\nRUN x \\\n")


def test_the_dockerignore_matcher_follows_docker_rules() -> None:
    patterns = df.parse_dockerignore("deploy/*\n!deploy/broker.toml\n**/__pycache__\n*.egg-info\n")
    assert df.is_ignored("deploy/k8s/service.yaml", patterns)
    assert not df.is_ignored("deploy/broker.toml", patterns)
    assert df.is_ignored("broker/server/__pycache__/x.pyc", patterns)
    assert df.is_ignored("x.egg-info/PKG-INFO", patterns)
    assert not df.is_ignored("broker/x.egg-info", patterns)  # anchored at the root
    assert not df.is_ignored("broker/cli.py", patterns)


# ---------------------------------------------------------------- static checks


def test_two_stages_on_python_3_11_slim(dockerfile: df.Dockerfile) -> None:
    assert len(dockerfile.stages) == 2
    global_args = _global_args(dockerfile, {})
    for stage in dockerfile.stages:
        assert df.substitute(stage.base, global_args) == "python:3.11-slim"
    build, final = dockerfile.stages
    assert build.name, "the build stage is named, for COPY --from"
    copies = [c for c in final.all("COPY") if c.flags.get("from") == build.name]
    assert [c.text.split() for c in copies if "chown" not in c.flags] == [["$PREFIX", "$PREFIX"]], (
        "final stage copies the venv (as root's: the broker cannot change its code)"
    )
    owned = [c.text.split()[-1] for c in copies if "chown" in c.flags]
    assert owned == [_stage_variables(dockerfile, final)["BROKER_DATA_DIR"]], (
        "the only other copy is the (empty) data directory, for the image's user"
    )
    assert not final.all("RUN") or all(_is_user_creation(r.text) for r in final.all("RUN")), (
        "the final stage only creates its user: everything else is built in the build stage"
    )


def test_the_broker_is_installed_into_a_venv_under_the_prefix_arg(
    dockerfile: df.Dockerfile,
) -> None:
    for stage in dockerfile.stages:
        names = [df.arg_definition(a)[0] for a in stage.all("ARG")]
        assert "PREFIX" in names, f"stage {stage.index} declares ARG PREFIX"
    runs = " ; ".join(r.text for r in dockerfile.stages[0].all("RUN"))
    assert re.search(r"-m venv \"?\$PREFIX", runs)
    install = re.search(r"pip\"? install ([^;&]*)", runs)
    assert install, "pip install in the build stage"
    words = install.group(1).split()
    assert "--no-cache-dir" in words and "." in words
    assert "-e" not in words and "--editable" not in words


def test_final_stage_user_is_a_fixed_non_root_uid(dockerfile: df.Dockerfile) -> None:
    final = _final(dockerfile)
    user = final.last("USER")
    assert user is not None, "the final stage sets USER"
    uid = user.text.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "USER is a numeric, non-root uid"
    assert _user_creation_uid(final) == int(uid), "USER is the uid useradd creates"
    k8s_uid = _statefulset()["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    assert k8s_uid == int(uid), "deploy/k8s runs the image's user"


def test_exposed_ports_are_the_listen_ports(dockerfile: df.Dockerfile) -> None:
    final = _final(dockerfile)
    variables = _stage_variables(dockerfile, final)
    exposed = {int(p.split("/")[0]) for e in final.all("EXPOSE") for p in e.text.split()}
    listen = {_port(variables["BROKER_LISTEN"]), _port(variables["BROKER_METRICS_LISTEN"])}
    assert exposed == listen == {7400, 9400}
    for name in ("BROKER_LISTEN", "BROKER_METRICS_LISTEN"):
        assert parse_address(variables[name])[0] == "0.0.0.0", f"{name} listens on all interfaces"


def test_entrypoint_healthcheck_and_stop_signal(dockerfile: df.Dockerfile) -> None:
    final = _final(dockerfile)
    entrypoint = final.last("ENTRYPOINT")
    assert entrypoint is not None and entrypoint.exec_form == ["broker", "serve"]
    cmd = final.last("CMD")
    assert cmd is None or cmd.exec_form == []
    stop = final.last("STOPSIGNAL")
    assert stop is not None and stop.text == "SIGTERM"
    healthcheck = _healthcheck_command(final)
    assert healthcheck.startswith("broker health"), "the image has no curl: broker health"
    variables = _stage_variables(dockerfile, final)
    assert "$PREFIX/bin" in _env_instruction_text(final) and variables["PATH"].startswith(
        variables["PREFIX"] + "/bin:"
    )


def test_the_data_directory_is_a_volume_owned_by_the_user(dockerfile: df.Dockerfile) -> None:
    final = _final(dockerfile)
    data_dir = _stage_variables(dockerfile, final)["BROKER_DATA_DIR"]
    assert data_dir == "/var/lib/broker"
    volumes = [v for volume in final.all("VOLUME") for v in df.exec_form(volume.text) or []]
    assert volumes == [data_dir]
    (copy,) = [c for c in final.all("COPY") if c.text.split()[-1] == data_dir]
    user = final.last("USER")
    assert user is not None and copy.flags["chown"] == user.text, "USER owns it"
    source = copy.text.split()[0]
    build = dockerfile.stage(copy.flags["from"])
    made = " ; ".join(r.text for r in build.all("RUN"))
    assert f"mkdir -m 0700 {PurePosixPath(source).name}" in made, "an empty directory, 0700"
    workdir = build.last("WORKDIR")
    assert workdir is not None and PurePosixPath(source).parent == PurePosixPath(workdir.text)


def test_the_config_file_is_in_the_image_and_named_by_broker_config(
    dockerfile: df.Dockerfile,
) -> None:
    final = _final(dockerfile)
    variables = _stage_variables(dockerfile, final)
    assert variables["BROKER_CONFIG"] == "/etc/broker/broker.toml"
    copied = {tuple(c.text.split()) for c in final.all("COPY") if "from" not in c.flags}
    assert ("deploy/broker.toml", "/etc/broker/broker.toml") in copied


def test_dockerignore_keeps_what_the_build_copies_and_drops_the_rest(
    dockerfile: df.Dockerfile,
) -> None:
    patterns = df.parse_dockerignore(DOCKERIGNORE.read_text(encoding="utf-8"))
    for stage in dockerfile.stages:
        for copy in stage.all("COPY") + stage.all("ADD"):
            if "from" in copy.flags:
                continue
            *sources, _ = shlex.split(copy.text)
            for source in sources:
                assert (REPO / source).exists(), f"line {copy.line}: {source} does not exist"
                assert not df.is_ignored(source, patterns), f".dockerignore drops {source}"
    for left_out in (".venv", ".git", "tests", "docs", "deploy/k8s", "broker/__pycache__"):
        assert df.is_ignored(left_out, patterns), f".dockerignore keeps {left_out}"


def _statefulset() -> dict[str, Any]:
    for document in load_yaml_all(K8S / "statefulset.yaml"):
        if document["kind"] == "StatefulSet":
            return dict(document)
    raise AssertionError("no StatefulSet in deploy/k8s/statefulset.yaml")


def _env_instruction_text(stage: df.Stage) -> str:
    return " ".join(e.text for e in stage.all("ENV"))


def _healthcheck_command(stage: df.Stage) -> str:
    """The shell command of the stage's HEALTHCHECK (exec form joined with spaces)."""
    healthcheck = stage.last("HEALTHCHECK")
    assert healthcheck is not None, "the final stage has a HEALTHCHECK"
    keyword, _, command = healthcheck.text.partition(" ")
    assert keyword.upper() == "CMD", "HEALTHCHECK CMD ..."
    exec_form = df.exec_form(command.strip())
    return shlex.join(exec_form) if exec_form is not None else command.strip()


def _is_user_creation(command: str) -> bool:
    """Whether every command of a RUN line is a user/group creation command."""
    parts = [p.strip() for p in re.split(r"&&|;|\n", command) if p.strip()]
    return bool(parts) and all(shlex.split(p)[0] in USER_CREATION for p in parts)


# ---------------------------------------------------------------- the steps run as a script


@dataclass
class ScriptRun:
    """The state of running a Dockerfile's steps as a script under ``root``.

    Image paths map into ``root / "rootfs"``, except paths that already lie
    inside ``root`` (the PREFIX build arg points there), which all stages
    share, so ``COPY --from=build $PREFIX $PREFIX`` copies a directory onto
    itself (a no-op). All stages share one file system.
    """

    root: Path
    context: Path
    ignore: list[df.IgnorePattern]
    base_env: dict[str, str]
    #: The uid/gid standing for the image's user when the test runs as root
    #: (COPY --chown gives files to it); None: this process's user owns all.
    owner: int | None = None
    log: list[str] = field(default_factory=list)

    @property
    def rootfs(self) -> Path:
        return self.root / "rootfs"

    def host_path(self, image_path: str, workdir: str = "/") -> Path:
        path = PurePosixPath(workdir) / image_path  # an absolute image_path wins
        if Path(path).is_relative_to(self.root):
            return Path(path)
        return self.rootfs / str(path).lstrip("/")

    def copy_from_context(self, sources: Sequence[str], dest: Path, to_dir: bool) -> None:
        for source in sources:
            rel = PurePosixPath(source).as_posix().lstrip("/")
            path = self.context / rel
            if not path.exists() or df.is_ignored(rel, self.ignore):
                raise AssertionError(f"COPY {source}: not in the build context")
            if path.is_dir():
                dest.mkdir(parents=True, exist_ok=True)
                for file in sorted(path.rglob("*")):
                    relative = file.relative_to(self.context).as_posix()
                    if file.is_dir() or df.is_ignored(relative, self.ignore):
                        continue
                    target = dest / file.relative_to(path)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(file, target)
            else:
                target = dest / path.name if to_dir else dest
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)

    def run_stage(
        self, dockerfile: df.Dockerfile, stage: df.Stage, build_args: dict[str, str]
    ) -> tuple[dict[str, str], str]:
        """Run the stage's steps; its final environment and working directory."""
        global_values = _global_args(dockerfile, build_args)
        args: dict[str, str] = {}
        env = dict(self.base_env)
        workdir = "/"
        self.rootfs.mkdir(mode=0o755, exist_ok=True)
        for step in stage.instructions:
            variables = {**args, **env}
            if step.keyword == "ARG":
                name, default = df.arg_definition(step)
                if name in build_args:
                    args[name] = build_args[name]
                elif default is not None:
                    args[name] = df.substitute(default, variables)
                else:
                    args[name] = global_values.get(name, "")
            elif step.keyword == "ENV":
                env.update(df.parse_key_values(step.text, variables))
            elif step.keyword == "WORKDIR":
                workdir = str(PurePosixPath(workdir) / df.substitute(step.text, variables))
                self.host_path(workdir).mkdir(parents=True, exist_ok=True)
            elif step.keyword == "COPY":
                words = [df.substitute(w, variables) for w in shlex.split(step.text)]
                *sources, dest_text = words
                to_dir = dest_text.endswith("/") or len(sources) > 1
                dest = self.host_path(dest_text, workdir)
                source_stage = step.flags.get("from")
                if source_stage is None:
                    self.copy_from_context(sources, dest, to_dir)
                else:
                    dockerfile.stage(source_stage)  # it exists
                    for source in sources:
                        origin = self.host_path(source, "/")
                        if origin.resolve() == dest.resolve():
                            continue  # the shared PREFIX: already in place
                        if origin.is_dir():
                            shutil.copytree(origin, dest, symlinks=True, dirs_exist_ok=True)
                        else:
                            dest.parent.mkdir(parents=True, exist_ok=True)
                            shutil.copy2(origin, dest / origin.name if to_dir else dest)
                if "chown" in step.flags and self.owner is not None:
                    for path in [dest, *(dest.rglob("*") if dest.is_dir() else [])]:
                        os.chown(path, self.owner, self.owner, follow_symlinks=False)
                self.log.append(f"COPY {' '.join(words)}")
            elif step.keyword == "RUN":
                if _is_user_creation(step.text):
                    self.log.append(f"skipped: RUN {step.text}")
                    continue
                argv = step.exec_form or ["/bin/sh", "-c", "umask 022\n" + step.text]
                self.log.append(f"RUN {step.text}")
                done = subprocess.run(
                    argv,
                    cwd=self.host_path(workdir),
                    env={**args, **env},
                    capture_output=True,
                    text=True,
                    timeout=480,
                    check=False,
                )
                assert done.returncode == 0, (
                    f"line {step.line}: RUN {step.text} exited {done.returncode}\n"
                    f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
                )
            elif step.keyword not in INERT:
                raise AssertionError(f"line {step.line}: the script run cannot do {step.keyword}")
        return env, workdir


def _python_for_the_image(as_nobody: bool) -> str:
    """A Python 3.11+ interpreter standing in for the image's ``python``: one
    whose installation the unprivileged user can read (pyenv's, under /root,
    is not)."""
    candidates = ["/usr/bin/python3.11", getattr(sys, "_base_executable", sys.executable)]
    check = "import sys, venv, ensurepip; assert sys.version_info >= (3, 11)"
    for candidate in candidates:
        if not Path(candidate).exists():
            continue
        argv = [candidate, "-c", check]
        if as_nobody:
            argv = _as_nobody(argv)
        if subprocess.run(argv, capture_output=True, check=False).returncode == 0:
            return candidate
    missing_tool(
        "python3.11 with venv",
        f"apt-get install python3.11-venv: a Python >= 3.11 with venv and ensurepip usable by "
        f"uid {NOBODY} among {candidates}",
    )


def _as_nobody(argv: list[str]) -> list[str]:
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _process_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            real, effective, *_ = line.split()[1:]
            assert real == effective
            return int(effective)
    raise AssertionError("no Uid line in /proc/PID/status")


def _http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        error.close()
        return int(error.code)


@pytest.fixture
def script_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="broker-dockerfile-", dir="/tmp"))
    root.chmod(0o755)  # traversable by the unprivileged user the broker runs as
    umask = os.umask(0o022)  # what Docker builds with: directories made here are 0755
    try:
        yield root
    finally:
        os.umask(umask)
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_the_dockerfile_steps_build_a_broker_that_runs_unprivileged(
    dockerfile: df.Dockerfile, script_root: Path
) -> None:
    """Build and run the image without Docker: the Dockerfile's RUN/COPY/WORKDIR
    steps, in order, as a script on this machine.

    - ``PREFIX`` (a build arg) points into a temporary directory; other image
      paths (WORKDIR, COPY destinations) map into ``<tmp>/rootfs``; the build
      context is the repository filtered by .dockerignore.
    - ``python`` is this machine's Python 3.11 (a fresh venv is made from it,
      and pip installs the broker and its dependencies from PyPI).
    - RUN steps that only create the image's user (groupadd/useradd) are
      skipped: the image's user is replaced by ``nobody`` (uid 65534), which
      runs the broker when the test runs as root (``setpriv``).
    - The broker starts as ENTRYPOINT + CMD with the final stage's ENV, except
      that BROKER_LISTEN and BROKER_METRICS_LISTEN name free 127.0.0.1 ports and
      image paths in the ENV (BROKER_CONFIG) map into the temporary directory.
    - The HEALTHCHECK command (shell form, reading BROKER_METRICS_LISTEN) must
      succeed within 20 s; the Kubernetes probe paths must answer 200; the
      process must run as the unprivileged uid; SIGTERM must end it with status
      0 within the shutdown deadline (plus interpreter start-up slack); then
      the health check must fail.
    """
    as_nobody = os.geteuid() == 0
    if as_nobody:
        require_tool(
            "setpriv", "apt-get install util-linux; running as root needs it to drop to nobody"
        )
    python = _python_for_the_image(as_nobody)
    shims = script_root / "python-shims"
    shims.mkdir()
    for name in ("python", "python3", "python3.11"):
        (shims / name).symlink_to(python)
    base_env = {
        "PATH": f"{shims}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "HOME": str(script_root / "rootfs" / "root"),
    }
    for name in ("http_proxy", "https_proxy", "no_proxy", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        if name in os.environ:  # reach PyPI as this machine does
            base_env[name] = os.environ[name]
    prefix = script_root / "opt" / "broker"
    script = ScriptRun(
        root=script_root,
        context=REPO,
        ignore=df.parse_dockerignore(DOCKERIGNORE.read_text(encoding="utf-8")),
        base_env=base_env,
        owner=NOBODY if as_nobody else None,
    )
    build_args = {"PREFIX": str(prefix)}
    for stage in dockerfile.stages[:-1]:
        script.run_stage(dockerfile, stage, build_args)
    final = _final(dockerfile)
    env, workdir = script.run_stage(dockerfile, final, build_args)
    assert any(line.startswith("skipped: RUN groupadd") for line in script.log), script.log
    assert (prefix / "bin" / "broker").exists(), "the venv under $PREFIX has the broker command"
    compiled = list((prefix / "lib").glob("python3*/site-packages/broker/__pycache__/*.pyc"))
    assert compiled, "pip compiled the bytecode: the image never writes any"

    # -- run it as the image would
    client_port, metrics_port = _free_port(), _free_port()
    for name, value in list(env.items()):
        if value.startswith("/") and ":" not in value and name != "HOME":
            env[name] = str(script.host_path(value))
    config_path = Path(env["BROKER_CONFIG"])
    assert config_path.is_file(), "BROKER_CONFIG names the config copied into the image"
    deadline = load_config(config_path, environ={}).shutdown_deadline
    env["BROKER_LISTEN"] = f"127.0.0.1:{client_port}"
    env["BROKER_METRICS_LISTEN"] = f"127.0.0.1:{metrics_port}"
    env.pop("HOME", None)
    entrypoint = final.last("ENTRYPOINT")
    cmd = final.last("CMD")
    assert entrypoint is not None and entrypoint.exec_form is not None
    argv = [*entrypoint.exec_form, *(cmd.exec_form or [] if cmd else [])]
    executable = shutil.which(argv[0], path=env["PATH"])
    assert executable == str(prefix / "bin" / "broker")
    argv[0] = executable
    health_argv = ["/bin/sh", "-c", _healthcheck_command(final)]
    if as_nobody:
        argv, health_argv = _as_nobody(argv), _as_nobody(health_argv)
    output = script_root / "broker.log"
    with output.open("wb") as log:
        process = subprocess.Popen(
            argv, cwd=script.host_path(workdir), env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        healthy = None
        give_up = time.monotonic() + 20
        while time.monotonic() < give_up:
            assert process.poll() is None, f"the broker exited:\n{output.read_text()}"
            healthy = subprocess.run(
                health_argv, env=env, capture_output=True, text=True, timeout=10, check=False
            )
            if healthy.returncode == 0:
                break
            time.sleep(0.25)
        assert healthy is not None and healthy.returncode == 0, (
            f"HEALTHCHECK {_healthcheck_command(final)!r} never succeeded; last run exited "
            f"{healthy and healthy.returncode}:\n{healthy and healthy.stderr}\n"
            f"broker output:\n{output.read_text()}"
        )
        expected_uid = NOBODY if as_nobody else os.getuid()
        assert _process_uid(process.pid) == expected_uid
        base = f"http://127.0.0.1:{metrics_port}"
        for path in _k8s_probe_paths():
            assert _http_status(base + path) == 200, f"k8s probe path {path}"
        with urllib.request.urlopen(base + "/metrics", timeout=5) as response:
            assert b"broker_build_info" in response.read()

        process.send_signal(signal.SIGTERM)
        try:
            status = process.wait(timeout=deadline + 5)
        except subprocess.TimeoutExpired:
            pytest.fail(f"no exit within {deadline + 5} s of SIGTERM:\n{output.read_text()}")
        assert status == 0, f"exit status {status}:\n{output.read_text()}"
        after = subprocess.run(health_argv, env=env, capture_output=True, timeout=10, check=False)
        assert after.returncode != 0, "the health check fails once the broker is gone"
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def _k8s_probe_paths() -> list[str]:
    container = _statefulset()["spec"]["template"]["spec"]["containers"][0]
    return [
        container[probe]["httpGet"]["path"]
        for probe in ("startupProbe", "livenessProbe", "readinessProbe")
        if probe in container
    ]
