"""The `biplane` command: a thin dispatcher to the subcommands each plane owns.

Only the chosen subcommand's module is imported, so `biplane --help` stays fast
and a broken optional piece (say, Spark) never stops the others from running.
Each target is a function `main(argv: list[str], prog: str) -> int`.
"""
from __future__ import annotations

import importlib
import sys

from common import cli_exit

# command -> ("module:function", one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "controller": ("controller.main:main", "run one controller node of the quorum"),
    "broker": ("dataplane.broker.main:main", "run a data-plane broker; or maintenance, decommission, "
                                             "recommission, operations of a running one"),
    "topic": ("controller.admin_cli:topic_main", "create, list, describe, alter or delete topics; add partitions"),
    "cluster": ("controller.admin_cli:cluster_main", "show the controller quorum, the brokers, the cluster's health; dynamic cluster config"),
    "reassign": ("controller.admin_cli:reassign_main", "move partition replicas (one, or a plan file with a throttle); progress, cancel, list"),
    "elect": ("controller.admin_cli:elect_main", "run a preferred-leader election"),
    "snapshot": ("controller.admin_cli:snapshot_main", "take or list controller snapshots"),
    "report": ("controller.report.cli:main", "capacity reports over controller snapshots (Spark)"),
    "up": ("dataplane.cluster.up:main", "start a local cluster (3 controllers, 3 brokers) on loopback"),
    "down": ("dataplane.cluster.up:down_main", "stop a local cluster started with `biplane up` (every process)"),
    "stop": ("dataplane.cluster.up:stop_main", "stop one broker or controller of `biplane up`'s cluster (stays down)"),
    "start": ("dataplane.cluster.up:start_main", "start a broker or controller that `biplane stop` stopped"),
    "restart": ("dataplane.cluster.up:restart_main", "restart one broker or controller of `biplane up`'s cluster"),
    "produce": ("dataplane.client.cli:produce_main", "send lines from stdin to a topic"),
    "consume": ("dataplane.client.cli:consume_main", "print a topic's records"),
    "bench": ("dataplane.client.cli:bench_main", "producer/consumer load generator: records/s, MB/s, latency"),
    "group": ("dataplane.client.group_cli:main", "list, describe, reset the offsets of, or delete consumer groups"),
}

# `biplane broker ACTION ...` operates on a running cluster's broker; `biplane broker
# --broker-id N ...` runs one.
BROKER_ACTIONS = ("maintenance", "decommission", "recommission", "operations")
BROKER_ADMIN = "controller.admin_cli:broker_main"

# Servers handle their own signals (a broker's SIGTERM is a controlled shutdown).
OWN_SIGNALS = frozenset({"controller", "broker", "up"})


def usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: biplane COMMAND [ARGS...]", "", "Biplane: a replicated log for event streams.", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {help_text}" for name, (_, help_text) in sorted(COMMANDS.items())]
    lines += ["", "Run `biplane COMMAND --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"biplane: unknown command {name!r}.\n\n{usage()}", file=sys.stderr)
        return 2
    target, own_signals = COMMANDS[name][0], name in OWN_SIGNALS
    if name == "broker" and rest and rest[0] in BROKER_ACTIONS:
        target, own_signals = BROKER_ADMIN, False
    if not own_signals:
        cli_exit.install_sigterm()
    try:
        module_name, function_name = target.split(":")
        function = getattr(importlib.import_module(module_name), function_name)
        code = int(function(rest, f"biplane {name}") or 0)
        sys.stdout.flush()   # here, where a closed pipe can still be caught
        return code
    except KeyboardInterrupt:
        return cli_exit.EXIT_INTERRUPTED
    except cli_exit.Terminated:
        return cli_exit.EXIT_TERMINATED
    except BrokenPipeError:
        cli_exit.silence_stdout()
        return cli_exit.EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
