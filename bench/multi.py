"""Run a cronhook command plus extra `cronhook scheduler` processes, as one command line for
the benches' --cronhook-cmd (until `--processes N` exists, and to compare with it):

    .venv/bin/python bench/compare.py --cronhook-cmd ".venv/bin/python bench/multi.py --schedulers 1 cronhook up"

Every process gets this environment (the harness's database, key and port) and its own
replica id; SIGTERM/SIGINT are passed on to all of them, and when one exits the others are
stopped. The benches stop the whole process group, so nothing outlives them.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schedulers", type=int, default=1, help="extra `cronhook scheduler` processes")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the main command, e.g. cronhook up")
    args = parser.parse_args()
    main_argv = list(args.command) or ["cronhook", "up"]
    if main_argv[0] == "cronhook":
        main_argv[0] = str(BIN / "cronhook")
    argvs = [main_argv] + [[str(BIN / "cronhook"), "scheduler"] for _ in range(args.schedulers)]
    procs = []
    for index, argv in enumerate(argvs):
        env = dict(os.environ)
        base = env.get("CRONHOOK_REPLICA_ID", f"bench-{os.getpid()}")
        env["CRONHOOK_REPLICA_ID"] = f"{base}-{index}"
        procs.append(subprocess.Popen(argv, env=env))

    def forward(signum: int, _frame: object) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while all(proc.poll() is None for proc in procs):
        time.sleep(0.2)
    forward(signal.SIGTERM, None)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return max(proc.returncode or 0 for proc in procs)


if __name__ == "__main__":
    sys.exit(main())
