"""The codegen-cache command."""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of `codegen-cache`."""
    parser = argparse.ArgumentParser(prog="codegen-cache", description="Look after a TVM codegen cache.")
    parser.add_argument("--dir", help="cache directory (default: CODEGEN_CACHE_DIR or the user cache dir)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="lower a few kernels cold, then warm, and print the times")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from ._demo import run_demo

        run_demo(args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
