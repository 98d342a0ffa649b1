"""The `codegen-cache` command: parser, maintenance commands and the tools behind them."""

from ._main import main

__all__ = ["main"]
