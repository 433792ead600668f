"""The ``dq-flower deploy`` parser (the subcommands are :mod:`dq_flower.deploy.commands`)."""

from __future__ import annotations

import argparse
from typing import Any

from dq_flower.cli_common import EXIT_USAGE
from dq_flower.deploy import TRUST_MODEL
from dq_flower.deploy.certs import DEFAULT_HOSTS
from dq_flower.deploy.commands import (
    DEFAULT_CONNECTION,
    cmd_certs,
    cmd_local,
    cmd_register,
    cmd_run,
    cmd_superlink,
    cmd_supernode,
    parse_config_pairs,
)

__all__ = ["add_deploy_parser", "parse_config_pairs"]


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
    p.add_argument("--app", default=".", metavar="DIR",
                   help="project folder with pyproject.toml (default .)")


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

    deploy.set_defaults(func=show_help)
    for add in (_certs_parser, _superlink_parser, _supernode_parser, _register_parser,
                _run_parser, _local_parser):
        add(sub)
    return deploy


def _certs_parser(sub: Any) -> None:
    p = sub.add_parser("certs", help="create a CA, the SuperLink certificate, SuperNode keys")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the files")
    p.add_argument("--nodes", type=int, default=2, metavar="N",
                   help="SuperNode key pairs node-0 .. node-{N-1} (default 2)")
    p.add_argument("--host", action="append", metavar="NAME_OR_IP",
                   help="a name or IP address SuperNodes reach the SuperLink at; repeat for "
                   f"several ({' and '.join(DEFAULT_HOSTS)} are always added)")
    p.add_argument("--days", type=int, default=365, help="validity (default 365)")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.set_defaults(func=cmd_certs)


def _superlink_parser(sub: Any) -> None:
    p = sub.add_parser("superlink", help="run a SuperLink (TLS + SuperNode authentication)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on; 0.0.0.0 for all interfaces (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=9093,
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
    p.set_defaults(func=cmd_superlink)


def _supernode_parser(sub: Any) -> None:
    p = sub.add_parser(
        "supernode", help="run a SuperNode on its own data file or on partition K of N",
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
    p.add_argument("--partition-id", type=int, metavar="K",
                   help="partition of the named data set (required without --data-file; "
                   "with it, only the node's stable key for seeds and upload order)")
    p.add_argument("--num-partitions", type=int, metavar="N",
                   help="number of partitions (required without --data-file)")
    p.add_argument("--data-dir", metavar="DIR",
                   help="this device's folder of the named data set (node config data-dir)")
    _add_client_tls_args(p, "no TLS (prints a warning)")
    p.add_argument("--auth-key", metavar="PRIVATE_KEY",
                   help="this node's private key (its .pub registered with 'deploy register')")
    p.add_argument("--runtime-port", type=int, default=9094,
                   help="local port for this node's ClientApp processes (default 9094; "
                   "one per SuperNode on a machine)")
    p.add_argument("--num-threads", type=int, metavar="T",
                   help="torch threads for training on this device (node config num-threads)")
    p.add_argument("--node-config", action="append", metavar="'k=v ...'",
                   help="more node config pairs")
    p.add_argument("--max-retries", type=int, help="give up after this many reconnects")
    p.add_argument("--max-wait-time", type=float, help="give up reconnecting after seconds")
    _add_process_output_args(p)
    p.set_defaults(func=cmd_supernode)


def _register_parser(sub: Any) -> None:
    p = sub.add_parser("register", help="register a SuperNode public key with the SuperLink")
    p.add_argument("public_key", metavar="KEY.pub")
    _add_connection_args(p)
    p.set_defaults(func=cmd_register)


def _run_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="flwr run this app and show the SuperLink's traffic")
    _add_app_arg(p)
    _add_connection_args(p)
    p.add_argument("--run-config", action="append", metavar="'k=v ...'",
                   help="override [tool.flwr.app.config] keys, e.g. 'num-server-rounds=3'")
    p.add_argument("--no-stream", action="store_true", help="submit the run and return")
    p.set_defaults(func=cmd_run)


def _local_parser(sub: Any) -> None:
    p = sub.add_parser("local", help="TLS deployment on this machine: one run, then stop")
    _add_app_arg(p)
    p.add_argument("--nodes", type=int, metavar="N",
                   help="SuperNodes (default: one per --data-file, else 2)")
    p.add_argument("--rounds", type=int, default=2, help="num-server-rounds (default 2)")
    p.add_argument("--run-config", action="append", metavar="'k=v ...'")
    p.add_argument("--data-dir", metavar="DIR", help="data folder given to every SuperNode")
    p.add_argument("--data-file", action="append", metavar="PATH",
                   help="a SuperNode's own .npz; repeat once per node (node k gets the k-th "
                   "file as its node config data-file; only that SuperNode is told the "
                   "path). Use with --run-config \"dataset='none' input-shape='1,8,8' "
                   "num-classes=10 fraction-evaluate=1.0\" for a server that holds no data")
    p.add_argument("--workdir", metavar="DIR", help="certs, logs, FLWR_HOME (default: temp)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds for the run")
    p.add_argument("--insecure", action="store_true", help="no TLS, no node authentication")
    p.set_defaults(func=cmd_local)
