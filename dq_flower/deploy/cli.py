"""The ``dq-flower deploy`` parser and its subcommands."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dq_flower.cli_common import EXIT_USAGE, PROG, float_arg, int_arg
from dq_flower.deploy import TRUST_MODEL
from dq_flower.deploy.certs import DEFAULT_HOSTS
from dq_flower.deploy.checks import FlowerApp, check_run_config, declared_only, read_app
from dq_flower.deploy.flower_cli import (
    RUN_STARTED,
    RunOutcome,
    compare_traffic,
    finished_run,
    flower_env,
    flower_executable,
    format_config,
    register_node,
    rounds_from_log,
    write_connection,
)
from dq_flower.deploy.local import LocalDeployment
from dq_flower.deploy.process_commands import (
    INSECURE_WARNING,
    cmd_certs,
    cmd_superlink,
    cmd_supernode,
    fail_deploy,
    parse_config_pairs,
    say,
    sigterm_as_interrupt,
    warn,
)
from dq_flower.deploy.supervisor import DeploymentError
from dq_flower.extras import NOT_ON_INDEX, RUNTIME_INSTALL_HINT
from dq_flower.harness.app_folder import default_app
from dq_flower.server.client_errors import last_exception

__all__ = ["add_deploy_parser", "parse_config_pairs", "cmd_certs", "cmd_superlink",
           "cmd_supernode", "cmd_register", "cmd_run", "cmd_local", "DEFAULT_CONNECTION",
           "EXIT_FAILED"]

EXIT_FAILED = 1
DEFAULT_CONNECTION = "dq-flower"
#: SuperNodes ``deploy local`` starts on one machine, at most (a process each, and helpers).
MAX_LOCAL_NODES = 256
MAX_PORT = 65535


def _failed(exc: DeploymentError) -> int:
    say(str(exc))
    if cause := last_exception(str(exc)):  # the run's own error last, out of the log above
        say(f"{PROG} deploy: failed: {cause}")
    return EXIT_FAILED


def _print_traffic(history: list[Any], outcome: RunOutcome) -> None:
    print(json.dumps({"run-id": outcome.run_id, "status": outcome.status,
                      **compare_traffic(history, outcome)}, indent=1))


def _connection(args: argparse.Namespace) -> str:
    """The ``flwr`` connection to use; written to ``$FLWR_HOME/config.toml`` if needed."""
    if args.superlink:
        path = write_connection(args.connection, args.superlink,
                                root_certificates=args.root_certificates,
                                insecure=args.insecure)
        say(f"connection [superlink.{args.connection}] -> {args.superlink} written to {path}")
    if args.insecure:
        say(INSECURE_WARNING)
    return str(args.connection)


def cmd_register(args: argparse.Namespace) -> int:
    """``dq-flower deploy register``."""
    if not Path(args.public_key).is_file():
        return fail_deploy(f"no such public key file: {args.public_key}")
    try:
        conn = _connection(args)
        node_id = register_node(args.public_key, conn, env=flower_env())
    except (FileNotFoundError, ValueError) as exc:
        return fail_deploy(str(exc))
    except DeploymentError as exc:
        return _failed(exc)
    print(f"registered {args.public_key}: node id {node_id}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """``dq-flower deploy run``: ``flwr run`` with the output shown, then the traffic."""
    say(TRUST_MODEL)
    try:  # the app and its run config before anything runs
        flower_app = read_app(args.app)
        overrides = parse_config_pairs(args.run_config)
        check_run_config(flower_app, overrides)
    except ValueError as exc:
        return fail_deploy(str(exc))
    app = flower_app.path
    try:
        conn = _connection(args)
        cmd = [flower_executable("flwr"), "run", str(app.resolve()), conn]
        if overrides:
            cmd += ["--run-config", format_config(overrides)]
        if not args.no_stream:
            cmd.append("--stream")
    except (FileNotFoundError, ValueError) as exc:
        return fail_deploy(str(exc))
    print(shlex.join(cmd), flush=True)
    env = flower_env()
    run_id = None
    output: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,  # noqa: S603
                          text=True, env=env, cwd=app) as proc:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                print(line, end="", flush=True)
                output.append(line)
                found = RUN_STARTED.search(line)
                if found:
                    run_id = int(found.group(1))
        except KeyboardInterrupt:
            proc.terminate()
            say(f"stopped following the run; it goes on (flwr stop {run_id} {conn})")
            return EXIT_FAILED
    if NOT_ON_INDEX in "".join(output):  # Flower's runtime installation found no dq-flower
        say(RUNTIME_INSTALL_HINT)
    if proc.returncode != 0 or run_id is None:
        return EXIT_FAILED
    if args.no_stream:
        return 0
    try:  # flwr run exits 0 even where the ServerApp failed: the run's status says
        info = finished_run(conn, run_id, env=env)
    except DeploymentError as exc:
        return _failed(exc)
    outcome = RunOutcome(run_id, info, "".join(output))
    print(f"run {run_id}: {info.get('status')}, SuperLink traffic "
          f"{json.dumps(info.get('network-traffic', {}))}")
    history = rounds_from_log(outcome.output)
    if history:  # the rounds' bytes of the log give the envelope
        _print_traffic(history, outcome)
    else:
        say("no per-round byte lines of dq_flower's ServerApp in the output: the envelope "
             "overhead needs the bytes the strategy measured (see docs/deploy.md)")
    if outcome.status != "finished:completed":
        cause = last_exception(outcome.output) or "its log above"
        say(f"run {run_id} ended as {outcome.status}: the ServerApp failed: {cause}")
        return EXIT_FAILED
    return 0


def _local_plan(args: argparse.Namespace) -> tuple[FlowerApp, int, list[Path], dict[str, Any]]:
    """The app, nodes, data files and run config of ``deploy local``, all checked.

    Raises ``ValueError`` naming what is wrong; nothing has started yet.
    """
    app = read_app(args.app)
    data_files = [Path(f) for f in args.data_file or []]
    nodes = args.nodes if args.nodes is not None else (len(data_files) or 2)
    if data_files and len(data_files) != nodes:
        raise ValueError(f"{len(data_files)} --data-file for {nodes} nodes; give one per node")
    missing = [str(f) for f in data_files if not f.is_file()]
    if missing:
        raise ValueError(f"no such data file: {', '.join(missing)}")
    overrides = parse_config_pairs(args.run_config)
    if args.rounds is not None and "num-server-rounds" not in app.config:
        raise ValueError(f"--rounds: {app.path} declares no num-server-rounds in its "
                         "[tool.flwr.app.config]")
    # what the command adds, only where the app declares it (Flower refuses other keys)
    added = {"num-server-rounds": args.rounds or 2, "results-path": "results.json"}
    if not args.insecure:  # authenticated SuperNodes: an identity stays with its node's key
        added["identity-binding"] = "node"
    run_config = {**declared_only(app, added), **overrides}
    check_run_config(app, run_config, nodes=nodes)
    return app, nodes, data_files, run_config


def _print_outcome(outcome: RunOutcome, results: Path | None, run_log: Path) -> None:
    """The rounds and the traffic (the package's app: its results file), or the run's status.

    Another app's rounds are its own; its output is in ``run_log``.
    """
    if results is not None and results.is_file():
        history = json.loads(results.read_text())["history"]
        for row in history:
            print(f"round {row['round']}: accuracy {row['accuracy']:.4f}, "
                  f"up {row['up_bytes']} B, down {row['down_bytes']} B")
        _print_traffic(history, outcome)
        return
    print(f"run {outcome.run_id}: {outcome.status}, SuperLink traffic "
          f"{json.dumps(outcome.info.get('network-traffic', {}))}; the run's output: {run_log}")
    if history := rounds_from_log(outcome.output):
        _print_traffic(history, outcome)


def cmd_local(args: argparse.Namespace) -> int:
    """``dq-flower deploy local``: a whole TLS deployment on loopback, one run, then stop."""
    warn(args)
    try:  # every argument and the run config, before anything starts
        app, nodes, data_files, run_config = _local_plan(args)
    except ValueError as exc:
        return fail_deploy(str(exc))
    if data_files and run_config.get("dataset", "digits") != "none" and app.is_package_app:
        say("note: the SuperNodes train on their --data-file; with dataset="
             f"{run_config.get('dataset', 'digits')!r} the server evaluates on that data set "
             "(give --run-config \"dataset='none' input-shape='...' num-classes=K "
             "fraction-evaluate=1.0\" for a server that holds no data)")
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="dq-deploy-"))
    results = None
    if "results-path" in run_config:
        results = workdir.resolve() / "results.json"
        run_config["results-path"] = str(results)
    say(f"working folder {workdir} (certs, logs, FLWR_HOME)")
    try:
        with sigterm_as_interrupt(), LocalDeployment(
                workdir, num_nodes=nodes, tls=not args.insecure,
                supernode_auth=not args.insecure, data_dir=args.data_dir,
                data_files=data_files) as dep:
            say(f"SuperLink {dep.address} (pid {dep.superlink.pid if dep.superlink else '?'})"
                 f", SuperNodes {[p.pid for p in dep.supernodes]}, node ids {dep.node_ids}")
            outcome = dep.run(app.path, run_config, timeout=args.timeout)
    except KeyboardInterrupt:
        say("interrupted; every process was stopped")
        return EXIT_FAILED
    except DeploymentError as exc:
        return _failed(exc)
    _print_outcome(outcome, results, dep.logs / "flwr-run.log")
    return 0


def _add_connection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--connection", default=DEFAULT_CONNECTION, metavar="NAME",
                   help="flwr connection name in $FLWR_HOME/config.toml "
                   f"(default {DEFAULT_CONNECTION})")
    p.add_argument("--superlink", metavar="HOST:PORT",
                   help="write/replace the connection NAME to this SuperLink first")
    _add_client_tls_args(p, "no TLS (prints a warning; testing on a network you control only)")


def _add_client_tls_args(p: argparse.ArgumentParser, insecure_help: str) -> None:
    tls = p.add_mutually_exclusive_group()
    tls.add_argument("--root-certificates", metavar="CA.crt",
                     help="CA certificate that signed the SuperLink's certificate")
    tls.add_argument("--insecure", action="store_true", help=insecure_help)


def _add_app_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--app", default=str(default_app()), metavar="DIR",
                   help="a Flower app's folder, with its pyproject.toml: any Flower app, or "
                   "the dq_flower project folder for the package's own app (default: . "
                   "where it has a pyproject.toml, else the package's own app)")


def _add_process_output_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-file", metavar="PATH", help="write output here instead of stdout")
    p.add_argument("--dry-run", action="store_true", help="print the command only")


def add_deploy_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``deploy`` and its subcommands to the ``dq-flower`` parser's ``subparsers``."""
    deploy: argparse.ArgumentParser = subparsers.add_parser(
        "deploy", help="run on real devices: certificates, SuperLink, SuperNodes, flwr run",
        description="Run dq_flower on real devices as Flower SuperLink and SuperNodes. "
        + TRUST_MODEL)
    sub = deploy.add_subparsers(dest="deploy_command", metavar="SUBCOMMAND")

    def show_help(args: argparse.Namespace) -> int:
        deploy.print_help()
        return EXIT_USAGE

    def parser(name: str, func: Callable[[argparse.Namespace], int],
               **kwargs: Any) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, **kwargs)
        p.set_defaults(func=func)
        return p

    deploy.set_defaults(func=show_help)
    p = parser("certs", cmd_certs, help="create a CA, the SuperLink certificate, SuperNode keys")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the files")
    p.add_argument("--nodes", type=int_arg(0, MAX_LOCAL_NODES), default=2, metavar="N",
                   help="SuperNode key pairs node-0 .. node-{N-1} (default 2)")
    p.add_argument("--host", action="append", metavar="NAME_OR_IP",
                   help="a name or IP address SuperNodes reach the SuperLink at; repeat for "
                   f"several ({' and '.join(DEFAULT_HOSTS)} are always added)")
    p.add_argument("--days", type=int_arg(1), default=365, help="validity (default 365)")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p = parser("superlink", cmd_superlink, help="run a SuperLink (TLS + SuperNode authentication)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on; 0.0.0.0 for all interfaces (default 127.0.0.1)")
    p.add_argument("--port", type=int_arg(1, MAX_PORT), default=9093,
                   help="port of the Fleet, Control and Runtime APIs (default 9093)")
    p.add_argument("--certs", metavar="DIR",
                   help="folder from 'deploy certs' (ca.crt, server.crt, server.key)")
    p.add_argument("--ssl-ca-certfile", metavar="CA.crt")
    p.add_argument("--ssl-certfile", metavar="SERVER.crt")
    p.add_argument("--ssl-keyfile", metavar="SERVER.key")
    p.add_argument("--insecure", action="store_true", help="no TLS (prints a warning)")
    p.add_argument("--no-auth", action="store_true",
                   help="accept any SuperNode (no --enable-supernode-auth; prints a warning)")
    p.add_argument("--simulation", action="store_true",
                   help="run Flower's simulation engine instead of waiting for SuperNodes")
    p.add_argument("--database", metavar="PATH",
                   help="SQLite file for the SuperLink's state (default: in memory)")
    p.add_argument("--allow-dependency-installation", action="store_true",
                   help="let each run 'uv sync' the app's dependencies (needs the network)")
    _add_process_output_args(p)
    p = parser(
        "supernode", cmd_supernode,
        help="run a SuperNode on its own data file or on partition K of N",
        description="Run a SuperNode. Its data is this device's own .npz file (--data-file; "
        "keys x_train, y_train and, for federated evaluation, x_test, y_test; written by "
        "dq_flower.harness.tasks.data.save_node_data), used as it is; only this SuperNode "
        "is told its path (DQ uploads quantized samples of it); or partition K of N of the "
        "run's named data set (--partition-id, --num-partitions). " + TRUST_MODEL)
    p.add_argument("--superlink", required=True, metavar="HOST:PORT")
    p.add_argument("--data-file", metavar="PATH",
                   help="this device's own .npz (node config data-file, made absolute); the "
                   "run config then usually has dataset='none', input-shape, num-classes "
                   "and fraction-evaluate > 0")
    p.add_argument("--partition-id", type=int_arg(0), metavar="K",
                   help="partition of the named data set (required without --data-file; "
                   "with it, only the node's stable key for seeds and upload order)")
    p.add_argument("--num-partitions", type=int_arg(1), metavar="N",
                   help="number of partitions (required without --data-file)")
    p.add_argument("--data-dir", metavar="DIR",
                   help="this device's folder of the named data set (node config data-dir)")
    _add_client_tls_args(p, "no TLS (prints a warning)")
    p.add_argument("--auth-key", metavar="PRIVATE_KEY",
                   help="this node's private key (its .pub registered with 'deploy register')")
    p.add_argument("--runtime-port", type=int_arg(1, MAX_PORT), default=9094,
                   help="local port for this node's ClientApp processes (default 9094; "
                   "one per SuperNode on a machine)")
    p.add_argument("--num-threads", type=int_arg(1), metavar="T",
                   help="torch threads for training on this device (node config num-threads)")
    p.add_argument("--node-config", action="append", metavar="'k=v ...'",
                   help="more node config pairs")
    p.add_argument("--max-retries", type=int_arg(0),
                   help="give up after this many reconnects")
    p.add_argument("--max-wait-time", type=float_arg(0),
                   help="give up reconnecting after seconds")
    _add_process_output_args(p)
    p = parser("register", cmd_register, help="register a SuperNode public key with the SuperLink")
    p.add_argument("public_key", metavar="KEY.pub")
    _add_connection_args(p)
    p = parser("run", cmd_run, help="flwr run this app and show the SuperLink's traffic")
    _add_app_arg(p)
    _add_connection_args(p)
    p.add_argument("--run-config", action="append", metavar="'k=v ...'",
                   help="override [tool.flwr.app.config] keys, e.g. 'num-server-rounds=3'")
    p.add_argument("--no-stream", action="store_true", help="submit the run and return")
    p = parser("local", cmd_local, help="TLS deployment on this machine: one run, then stop")
    _add_app_arg(p)
    p.add_argument("--nodes", type=int_arg(1, MAX_LOCAL_NODES), metavar="N",
                   help="SuperNodes (default: one per --data-file, else 2)")
    p.add_argument("--rounds", type=int_arg(1), metavar="N",
                   help="num-server-rounds, where the app declares it (default 2)")
    p.add_argument("--run-config", action="append", metavar="'k=v ...'")
    p.add_argument("--data-dir", metavar="DIR", help="data folder given to every SuperNode")
    p.add_argument("--data-file", action="append", metavar="PATH",
                   help="a SuperNode's own .npz; repeat once per node (node k gets the k-th "
                   "file as its node config data-file; only that SuperNode is told the "
                   "path). Use with --run-config \"dataset='none' input-shape='1,8,8' "
                   "num-classes=10 fraction-evaluate=1.0\" for a server that holds no data")
    p.add_argument("--workdir", metavar="DIR", help="certs, logs, FLWR_HOME (default: temp)")
    p.add_argument("--timeout", type=float_arg(0), default=900.0,
                   help="seconds for the run")
    p.add_argument("--insecure", action="store_true", help="no TLS, no node authentication")
    return deploy
