"""What the ``dq-flower deploy`` commands share, and those that start one process each.

``certs``, ``superlink`` and ``supernode`` (each runs its Flower process in the foreground
until it exits or Ctrl-C), the trust-model warnings and the ``key=value`` parser of
``--run-config`` and ``--node-config``.
"""

from __future__ import annotations

import argparse
import re
import shlex
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import tomli

from dq_flower.cli_common import PROG, fail
from dq_flower.deploy import TRUST_MODEL
from dq_flower.deploy.certs import DEFAULT_HOSTS, create_credentials, load_credentials
from dq_flower.deploy.flower_cli import flower_env, superlink_command, supernode_command
from dq_flower.deploy.supervisor import start_process

__all__ = ["INSECURE_WARNING", "say", "warn", "fail_deploy", "parse_config_pairs",
           "sigterm_as_interrupt", "cmd_certs", "cmd_superlink", "cmd_supernode"]

INSECURE_WARNING = (
    "WARNING: --insecure turns TLS off: quantized training samples and the model cross the "
    "network in clear text, and SuperNodes cannot verify the SuperLink. Use it only on a "
    "network you control, for testing."
)


def say(message: str) -> None:
    """One line to stderr, at once."""
    print(message, file=sys.stderr, flush=True)


def warn(args: argparse.Namespace) -> None:
    """The trust model, and the warning of ``--insecure``."""
    say(TRUST_MODEL)
    if args.insecure:
        say(INSECURE_WARNING)


def fail_deploy(message: str) -> int:
    """A usage error of ``dq-flower deploy``: one line, exit status 2."""
    return fail(message, f"{PROG} deploy")


def parse_config_pairs(items: list[str] | None) -> dict[str, Any]:
    """Parse ``["k=v k2='a b'", ...]`` like ``flwr``'s ``--run-config`` (TOML values)."""
    out: dict[str, Any] = {}
    pattern = re.compile(r"(\S+?)=('[^']*'|\"[^\"]*\"|\S+)")
    for item in items or []:
        rest = pattern.sub("", item).strip()
        if rest:
            raise ValueError(f"cannot parse {rest!r} in {item!r}; expected key=value pairs")
        for key, raw in pattern.findall(item):
            try:
                out[key] = tomli.loads(f"v = {raw}")["v"]
            except tomli.TOMLDecodeError:
                out[key] = raw  # a bare word (method=dq): taken as a string
    return out


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into ``KeyboardInterrupt`` so ``finally`` blocks stop child processes."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _foreground(cmd: list[str], dry_run: bool, log_file: str | None = None) -> int:
    """Print ``cmd``; unless ``dry_run``, run it until it exits or Ctrl-C/SIGTERM."""
    print(shlex.join(cmd), flush=True)
    if dry_run:
        return 0
    proc = start_process(cmd, log_path=log_file, env=flower_env())
    say(f"started {proc.name} (pid {proc.pid})"
         + (f", log: {log_file}" if log_file else "") + "; Ctrl-C stops it")
    try:
        with sigterm_as_interrupt():
            return proc.wait()
    except KeyboardInterrupt:
        say(f"stopping {proc.name} (pid {proc.pid})")
        return 0
    finally:
        proc.stop()


def cmd_certs(args: argparse.Namespace) -> int:
    """``dq-flower deploy certs``."""
    hosts = list(dict.fromkeys([*(args.host or []), *DEFAULT_HOSTS]))
    try:
        creds = create_credentials(args.out, num_nodes=args.nodes, hosts=hosts,
                                   days=args.days, overwrite=args.force)
    except (FileExistsError, ValueError) as exc:
        return fail_deploy(str(exc))
    print(f"CA certificate      {creds.ca_cert}  (copy to every SuperNode and flwr user)")
    print(f"CA key              {creds.ca_key}  (keep offline)")
    print(f"SuperLink cert/key  {creds.server_cert}, {creds.server_key}  (valid for "
          f"{', '.join(hosts)})")
    for keys in creds.nodes:
        print(f"SuperNode key pair  {keys.private_key} (private, copy to that device only), "
              f"{keys.public_key} (register it)")
    return 0


def _tls_paths(args: argparse.Namespace) -> tuple[str | None, str | None, str | None]:
    if args.certs:
        creds = load_credentials(args.certs)
        return str(creds.ca_cert), str(creds.server_cert), str(creds.server_key)
    return args.ssl_ca_certfile, args.ssl_certfile, args.ssl_keyfile


def cmd_superlink(args: argparse.Namespace) -> int:
    """``dq-flower deploy superlink``."""
    warn(args)
    try:
        ca, cert, key = (None, None, None) if args.insecure else _tls_paths(args)
        if args.no_auth and not args.simulation:
            say("WARNING: --no-auth: the SuperLink accepts any SuperNode that can reach it.")
        cmd = superlink_command(
            host=args.host, port=args.port, ca_cert=ca, server_cert=cert, server_key=key,
            insecure=args.insecure, supernode_auth=not args.no_auth,
            simulation=args.simulation, database=args.database,
            dependency_installation=args.allow_dependency_installation)
    except (FileNotFoundError, ValueError) as exc:
        return fail_deploy(f"{exc} (give --certs DIR from 'dq-flower deploy certs', or --insecure)")
    return _foreground(cmd, args.dry_run, args.log_file)


def cmd_supernode(args: argparse.Namespace) -> int:
    """``dq-flower deploy supernode``."""
    warn(args)
    if not args.insecure and args.root_certificates is None:
        say("note: no --root-certificates: the SuperLink's certificate must be trusted by "
             "this system's CA store")
    if args.auth_key is None:
        say("note: no --auth-key: only a SuperLink started with --no-auth accepts this node")
    if args.data_file is not None and not args.dry_run and not Path(args.data_file).is_file():
        return fail_deploy(f"no such data file: {args.data_file}")
    try:
        extra = parse_config_pairs(args.node_config)
        if args.num_threads is not None:
            extra["num-threads"] = args.num_threads
        cmd = supernode_command(
            superlink=args.superlink, partition_id=args.partition_id,
            num_partitions=args.num_partitions, data_file=args.data_file, data_dir=args.data_dir,
            root_certificates=args.root_certificates, private_key=args.auth_key,
            insecure=args.insecure, runtime_port=args.runtime_port, node_config=extra,
            max_retries=args.max_retries, max_wait_time=args.max_wait_time)
    except (FileNotFoundError, ValueError) as exc:
        return fail_deploy(f"{exc} (give --data-file PATH, or --partition-id K --num-partitions N)")
    return _foreground(cmd, args.dry_run, args.log_file)
