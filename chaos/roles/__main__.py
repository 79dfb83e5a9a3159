"""``python -m chaos.roles ROLE ...``: run one role process until SIGTERM."""

from __future__ import annotations

import sys

from chaos.roles.common import parse_args


def main(argv: list[str]) -> int:
    """Dispatch to the role's ``run``."""
    args = parse_args(argv)
    if args.role == "producer":
        from chaos.roles.producer import run
    elif args.role == "processor":
        from chaos.roles.processor import run
    elif args.role == "intruder":
        from chaos.roles.intruder import run
    elif args.role == "flooder":
        from chaos.roles.flooder import run
    elif args.role == "twophase":
        from chaos.roles.twophase import run
    else:
        from chaos.roles.consumer import run
    return run(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
