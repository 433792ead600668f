"""Print (and write) time to the target per (device, link) pair for a compare folder.

Usage: python results/regen/device_times.py DIR [--server gpu] [--device NAME ...]
       [--link NAME ...] [--out FILE]

Reads DIR/results.json, counts the model's FLOPs per sample and the rows per client
(:func:`dq_flower.compare.work.workload_of`: it loads the preset's data set), and prints the
markdown table of :func:`dq_flower.compare.device_report.device_link_table`; ``--out``
writes it too. Nothing is rerun: the bytes and rounds are the measured ones.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dq_flower.compare.device_report import device_link_table
from dq_flower.compare.devices import BUILTIN_DEVICES, parse_device, parse_server
from dq_flower.compare.links import BUILTIN_LINKS, parse_links
from dq_flower.compare.work import workload_of


def main() -> None:
    """Parse the arguments, print the table, write it where ``--out`` says."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir")
    parser.add_argument("--server", default="gpu")
    parser.add_argument("--device", action="append", default=[])
    parser.add_argument("--link", action="append", default=[])
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    results = json.loads((Path(args.dir) / "results.json").read_text())
    devices = [parse_device(d) for d in (args.device or list(BUILTIN_DEVICES))]
    links = parse_links(args.link or list(BUILTIN_LINKS))
    lines = device_link_table(results, workload_of(results["preset"]), devices,
                              parse_server(args.server), links)
    command = ("python results/regen/device_times.py " + args.dir
               + f" --server {args.server}"
               + "".join(f" --device {d}" for d in args.device)
               + "".join(f" --link {x}" for x in args.link))
    text = "\n".join([*lines, f"Command: `{command}`.", ""])
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
