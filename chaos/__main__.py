"""``python -m chaos [--profile short|soak] [--minutes N] [--seed S] [--json PATH]``.

Exit code: 0 when the checks found no anomaly, 1 when they found any, 2 when the run
itself failed (cluster did not start, ...), 130 when interrupted.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import tempfile
from pathlib import Path

from rich.console import Console

from chaos.profile import PROFILES, profile
from chaos.report import print_summary, write_summary
from chaos.run import ChaosRun


def main(argv: list[str]) -> int:
    """Run the harness once."""
    ap = argparse.ArgumentParser(prog="python -m chaos", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", choices=sorted(PROFILES), default="short")
    ap.add_argument("--minutes", type=float, default=None,
                    help="workload length in minutes (soak: default 30)")
    ap.add_argument("--seed", type=int, default=None, help="nemesis and workload seed")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where the cluster, logs and truth files go (default: a new temp dir)")
    ap.add_argument("--json", type=Path, default=None,
                    help="also write the JSON summary here (it is always in WORKDIR)")
    ap.add_argument("--keep-data", action="store_true",
                    help="keep the brokers' data after the run (logs and truth files stay)")
    ap.add_argument("--cleanup", type=Path, default=None, metavar="WORKDIR",
                    help="stop what a run killed with -9 left behind in WORKDIR, then exit")
    args = ap.parse_args(argv)
    if args.cleanup is not None:
        return _cleanup(args.cleanup)
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    prof = profile(args.profile, args.minutes)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="txnstream-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # logs and CI: wide enough for the anomaly table
    console.log(f"chaos: profile {prof.name} ({prof.workload_s / 60:.1f} min of workload), "
                f"seed {seed}, workdir {workdir}")
    run = ChaosRun(prof, seed, workdir, console)
    code = run.execute()
    if not args.keep_data:
        run.remove_broker_data()
    write_summary(workdir / "summary.json", run.summary)
    if args.json is not None:
        write_summary(args.json, run.summary)
    print_summary(console, run.summary)
    console.print(f"summary: {workdir / 'summary.json'}; logs: {workdir / 'logs'}; "
                  f"replay with --seed {seed}", highlight=False)
    return code


def _cleanup(workdir: Path) -> int:
    """Kill the role processes and stop the brokers of an earlier run in ``workdir``."""
    from chaos.supervisor import cleanup_workdir
    from txnstream.cluster import LocalCluster

    cluster = LocalCluster.from_state_dir(workdir / "cluster")
    if cluster is None:
        print(f"no chaos cluster in {workdir}")
        return 1
    killed = cleanup_workdir(workdir, cluster.bootstrap)
    cluster.down(timeout_s=10.0)
    print(f"killed {len(killed)} role process(es); brokers of {workdir / 'cluster'} stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
