"""``rlgauge detection-matrix``: the parser and ``cmd_detection_matrix``; the work is ``harness.detection``'s."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.options import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_OK
from harness.errors import UserError

GATE_NAMES = {"gate": "gate", "gate-base": "gate --base", "asv-relative": "asv relative costs",
              "asv-counts": "asv counts", "plugin": "pytest plugin", "tests": "parity/flag tests"}
"""The command line's names of the gates."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    from harness.detection.plants import PLANTS

    parser = sub.add_parser(
        "detection-matrix", help="plant each kind of regression in a scratch clone and run every gate on it, k of n",
        description="Plant each kind of regression (same-thread CPU, a busy thread, a thread count, a global torch "
                    "setting, a host sync, a kernel, float64, a flag made a no-op; and an A/A commit) as a throwaway "
                    "commit of a scratch clone of this repository, run every gate on each against HEAD, and print "
                    "the table of caught k of n. Resumable: rerun the same command to measure what is missing. "
                    "Takes hours on two cores (docs/tracking.md).")
    parser.add_argument("--runs", type=int, default=3, help="runs of every cell (default: 3)")
    parser.add_argument("--plants", metavar="a,b,...", help=f"only these plants (accepted: {', '.join(PLANTS)})")
    parser.add_argument("--gates", metavar="a,b,...", help=f"only these gates (accepted: {', '.join(GATE_NAMES)})")
    parser.add_argument("--busy", type=int, default=0, metavar="N",
                        help="N busy-loop processes beside the measurements (a loaded machine; default: 0)")
    parser.add_argument("--aa-chain", type=int, default=0, metavar="N",
                        help="also N empty commits in a row, each compared with its parent by the asv gates as "
                             "make asv-continuous compares two commits (their false alarms in N comparisons; "
                             "default: 0)")
    parser.add_argument("--workdir", type=Path, metavar="DIR",
                        help="the scratch clone, asv's environments and the saved cells (default: a folder "
                             "under the system's temporary folder named after this repository)")
    parser.add_argument("--out", type=Path, metavar="FILE.md", help="also write the table here")
    parser.add_argument("--doc", type=Path, metavar="FILE.md",
                        help="replace the table between the detection-matrix markers of this file "
                             "(docs/tracking.md)")
    parser.add_argument("--base", default="HEAD", metavar="REF",
                        help="the commit the plants are made on and measured against (default: HEAD)")
    parser.add_argument("--table-only", action="store_true", help="print the table of the saved cells; measure nothing")


def _chosen(value: str | None, accepted: dict | list, what: str) -> list[str]:
    if value is None:
        return list(accepted)
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in accepted]
    if unknown or not names:
        raise UserError(f"--{what}: unknown {', '.join(unknown) or '(none given)'}; accepted: {', '.join(accepted)}")
    return names


def cmd_detection_matrix(args: argparse.Namespace) -> int:
    from harness.detection import matrix
    from harness.detection.plants import PLANTS

    if args.runs < 1 or args.busy < 0 or args.aa_chain < 0:
        raise UserError(f"--runs {args.runs} / --busy {args.busy} / --aa-chain {args.aa_chain}: give at least one "
                        "run and no negative count")
    plants = _chosen(args.plants, list(PLANTS), "plants")
    chosen = [GATE_NAMES[name] for name in _chosen(args.gates, GATE_NAMES, "gates")]
    repo = Path.cwd()
    workdir = args.workdir or matrix.default_workdir(repo)
    code = EXIT_OK
    if args.table_only:
        base = matrix.check_repository(repo, args.base)
        if not any(workdir.glob("state*.json")):
            raise UserError(f"{workdir / 'state.json'}: no saved cells; run the matrix first")
    else:
        try:
            base = matrix.measure(repo, workdir, plants, chosen, args.runs, args.busy, args.base,
                                  args.aa_chain).data["base"]
        except KeyboardInterrupt:
            print("rlgauge: interrupted; the cells measured are kept (rerun to measure the rest)")
            base = matrix.check_repository(repo, args.base)
            code = EXIT_INTERRUPTED
    text = matrix.tables(workdir, base)
    print(text, end="")
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    if args.doc:
        matrix.write_doc(args.doc, text)
    return code


COMMANDS = {"detection-matrix": cmd_detection_matrix}
