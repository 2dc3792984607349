"""The `biplane` command: a thin dispatcher to the subcommands each plane owns.

Each entry names the module that builds its argparse subparser, so `biplane --help`
stays cheap (no pyspark or pysyncobj import until a command needs it).
"""
from __future__ import annotations

import argparse
import importlib
import sys

# command -> (module with `register(subparsers)` , one-line help)
COMMANDS: dict[str, tuple[str, str]] = {}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="biplane", description="Biplane: a replicated log for event streams.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in sorted(COMMANDS.items()):
        module = importlib.import_module(module_name)
        module.register(subparsers, name, help_text)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    result = args.func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
