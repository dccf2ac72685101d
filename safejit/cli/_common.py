"""Shared pieces of the command line: the console, config and roots, progress bars."""

from __future__ import annotations

import argparse
import os

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..config import Config

console = Console(highlight=False)


def config_for(cache_dir: str | None) -> Config:
    cfg = Config.from_env()
    return cfg.replace(cache_dirs=(cache_dir,)) if cache_dir else cfg


def roots_of(args: argparse.Namespace) -> tuple[str, ...]:
    return (args.cache_dir,) if args.cache_dir else Config.from_env().resolved_cache_dirs()


def progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


def count_dir(path: str) -> int:
    try:
        with os.scandir(path) as it:
            return sum(1 for _ in it)
    except OSError:
        return 0


def age_text(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"
