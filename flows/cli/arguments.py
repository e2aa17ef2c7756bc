"""What the commands read from their parsed arguments: the run config (preset, --config, --set) and counts.

Imports stay inside the functions: `ctrpipe --help` loads none of the config code.
"""

from __future__ import annotations

import argparse
from typing import Any


def load_config_of(args: argparse.Namespace) -> Any:
    """The run config a command names: its --preset, the --config file over it, then each --set."""
    from flows.config import load_config
    from flows.presets import by_name

    return load_config(args.config, args.overrides, base=by_name(args.preset))


def at_least_one(**values: int) -> None:
    """Each count given (`days=3`) is at least 1, or a ValueError naming its option."""
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
