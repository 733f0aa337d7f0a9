"""``python -m probes.ckpt A B``: the checkpoint comparison document on one line of strict JSON (a non-finite number
as ``{"$nonfinite": "NaN"}``), for the engine's ``command`` collector or a person. Exit 0 with the document, whatever
it says (a missing checkpoint is its ``error``); 2 for a wrong argument; 3 without the dependencies."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from probes.ckpt import FORMATS
from probes.ckpt.collector import MissingDependencies, collect
from probes.emit import strict


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m probes.ckpt", description="Compare two checkpoints tensor by tensor.")
    p.add_argument("a", help="the checkpoint under test")
    p.add_argument("b", help="the reference checkpoint (the run that never stopped)")
    p.add_argument("--format", default="auto", choices=FORMATS)
    p.add_argument("--rtol", type=float, default=0.0)
    p.add_argument("--atol", type=float, default=0.0)
    p.add_argument("--ignore", action="append", default=[], metavar="GLOB", help="group.name glob; repeatable")
    p.add_argument("--no-default-ignore", action="store_true", help="compare what the format ignores by default")
    p.add_argument("--trust-pickle", action="store_true", help="load with full pickle what weights_only refuses")
    ns = p.parse_args(argv)
    args = {
        "a": ns.a,
        "b": ns.b,
        "format": ns.format,
        "rtol": ns.rtol,
        "atol": ns.atol,
        "ignore": ns.ignore,
        "default_ignore": not ns.no_default_ignore,
        "trust_pickle": ns.trust_pickle,
    }
    try:
        doc = collect(args, {})
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except MissingDependencies as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    print(json.dumps(strict(doc), allow_nan=False, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
