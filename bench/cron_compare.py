"""Cron engine comparison: cronhook's fire times against cronsim's (healthchecks.io's engine).

Not a test: it lists every difference with its class and prints timings; the last line is a
JSON summary. cronsim is not a dependency of cronhook: `pip install -e '.[bench]'` (or
`pip install cronsim`) into the venv first.

Cases: curated expressions (the classes of issue 13 and each extension) plus seeded random
ones from the oracle test's generator, times every zone, times `--starts` start instants
in 2026-2030 (half of them just before one of the zone's clock changes); for each case the
next `--fires` fire instants of both engines are compared. A difference is classed as:

- dst-policy: both engines match the same wall-clock times (compared with naive datetimes),
  only the mapping to instants around a clock change differs. cronhook follows its
  documented policy; cronsim mimics Debian cron (a fixed-time job in a gap fires when the
  clock resumes, any job whose minute or hour field starts with `*` runs on UTC ticks);
- semantic: the wall-clock times differ. The brute-force Vixie reference of the tests
  (tests/unit/cron_reference.py) then says which engine is right: `cronhook` (cronsim
  wrong), `cronsim` (a cronhook bug) or `neither`;
- cronsim-refuses / cronhook-refuses: one engine rejects the expression (cronsim rejects
  `?`, `nW`, `Ld`, wrap-around ranges; cronhook rejects what its README says it does);
- bound: cronhook says "never fires" (nothing within 5 years) where cronsim, which looks
  50 years ahead, finds a time.

Timings: microseconds per next-fire computation from a fresh start (what the scheduler and
one preview item cost: parse from cache, zone, one fire time), and per fire time when
iterating `--fires` of them, for both engines on the same cases.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

# The oracle test's generator and Vixie reference live in tests/, found through the repository
# root (after the installed packages, so `app` stays the installed one).
sys.path.append(str(Path(__file__).resolve().parent.parent))

from cronsim import CronSim, CronSimError
from harness import parse_args, positive_int, print_result

from app.domain.cron import ALIASES, CronError, parse_cron, upcoming
from app.domain.cron_fields import parse_fields
from tests.unit.cron_reference import Reference
from tests.unit.test_cron_oracle import ZONES, clock_changes, random_expression

UTC = dt.UTC

CURATED = [
    # Plain and common.
    "*/5 * * * *",
    "0 9 * * 1-5",
    "30 2 * * *",
    "0 */2 * * *",
    "15,45 * * * *",
    "0 0 1 * *",
    "0 0 1 1 *",
    "0 12 * * SUN",
    "*/20 * * * * *",
    "30 0 9 * * *",
    "@hourly",
    "@daily",
    "@weekly",
    "@monthly",
    # One-value ranges (issue 13, class 1).
    "0 9-9 * * *",
    "5-5 * * * *",
    "0 0 * * 0-0",
    "0 0 1 6-6 *",
    # The day rule (class 2).
    "15 12 */10 * SAT",
    "0 0 */2 * 1",
    "0 0 1,15 * 1",
    "0 0 1-7 * 1",
    "0 0 * * 1",
    "0 0 ? * 1",
    # # with a restricted day-of-month (class 3).
    "45 22 8-14 * 3#2",
    "0 1 28-31 * 3#2",
    "45 9 */10 * 3#2",
    "0 9 * * MON#1",
    # Extensions.
    "0 12 L * *",
    "0 12 LW * *",
    "0 12 15W * *",
    "0 12 31W * *",
    "0 12 * * 5L",
    "0 12 * * L5",
    "0 12 L * 5",
    # Wrap-around ranges.
    "0 22-2 * * *",
    "0 0 * * FRI-MON",
    "0 0 1 NOV-FEB *",
    # Rare or never.
    "0 0 29 2 *",
    "0 0 29 2 1",
    "0 0 30 2 *",
]
EXTRA_ZONES = [
    "Europe/London",
    "America/Los_Angeles",
    "America/Sao_Paulo",
    "America/Mexico_City",
    "Asia/Kolkata",
    "Asia/Tokyo",
    "Asia/Tehran",
    "Europe/Moscow",
    "America/Godthab",
    "Australia/Adelaide",
    "America/Asuncion",
]
FIRST = dt.datetime(2026, 1, 1, tzinfo=UTC)
LAST = dt.datetime(2030, 12, 31, tzinfo=UTC)


def cronsim_expression(expression: str) -> str:
    return ALIASES.get(expression.strip().lower(), expression)


def cronsim_fires(expression: str, start: dt.datetime, count: int) -> list[dt.datetime]:
    """cronsim's next `count` times after `start` (aware: instants in UTC; naive: walls)."""
    iterator = CronSim(cronsim_expression(expression), start)
    fires = []
    try:
        for _ in range(count):
            fire = next(iterator)
            fires.append(fire.astimezone(UTC) if start.tzinfo is not None else fire)
    except StopIteration:
        pass
    return fires


def cronhook_walls(expression: str, start: dt.datetime, count: int) -> list[dt.datetime]:
    fields = parse_fields(tuple(parse_cron(expression).expression.upper().split(" ")))
    walls = fields.walls(start, inclusive=False)
    return [wall for wall, _ in zip(walls, range(count), strict=False)]


def build_cases(rnd: random.Random, expressions: int, starts: int) -> list[tuple[str, str, dt.datetime]]:
    chosen = list(CURATED)
    while len(chosen) < expressions:
        expression = random_expression(rnd)
        # Mostly expressions both engines accept, so that their meanings can be compared.
        if _cronsim_accepts(expression) or rnd.random() < 0.1:
            chosen.append(expression)
    cases = []
    for expression in chosen:
        for zone in [*ZONES, *EXTRA_ZONES]:
            changes = clock_changes(zone)
            for index in range(starts):
                if changes and index % 2:
                    start = rnd.choice(changes) - dt.timedelta(seconds=rnd.randint(0, 6 * 3600))
                else:
                    start = FIRST + dt.timedelta(seconds=rnd.randint(0, int((LAST - FIRST).total_seconds())))
                cases.append((expression, zone, start))
    return cases


def _cronsim_accepts(expression: str) -> bool:
    try:
        CronSim(cronsim_expression(expression), FIRST)
    except CronSimError:
        return False
    return True


def classify(expression: str, zone: str, start: dt.datetime, fires: int) -> tuple[str, str]:
    """(class, detail) for one case."""
    try:
        spec = parse_cron(expression)
    except CronError as exc:
        try:
            CronSim(cronsim_expression(expression), start)
        except CronSimError:
            return "both-refuse", exc.message
        return "cronhook-refuses", exc.message
    try:
        CronSim(cronsim_expression(expression), start)
    except CronSimError as exc:
        return "cronsim-refuses", str(exc)
    local_start = start.astimezone(ZoneInfo(zone))
    theirs = cronsim_fires(expression, local_start, fires)
    try:
        ours = upcoming(spec, zone, start, fires)
    except CronError:
        ours = []
    if ours == theirs:
        return "agree", ""
    # cronhook stopped (nothing within 5 years) where cronsim went on.
    if ours == theirs[: len(ours)] and theirs[len(ours)] - (ours[-1] if ours else start) > dt.timedelta(days=5 * 365):
        return "bound", f"cronhook stops after {_iso(_first(ours[-1:]))}, cronsim goes on at {_iso(theirs[len(ours)])}"
    wall_start = local_start.replace(tzinfo=None)
    count = 2 * fires
    index = next(i for i in range(fires) if ours[i : i + 1] != theirs[i : i + 1])
    detail = f"fire #{index + 1}: cronhook {_iso(_first(ours[index:]))}, cronsim {_iso(_first(theirs[index:]))}"
    if cronhook_walls(expression, wall_start, count) == cronsim_fires(expression, wall_start, count):
        return "dst-policy", detail
    reference = Reference(expression).upcoming(ZoneInfo(zone), start, fires)
    right = "cronhook" if reference == ours else "cronsim" if reference == theirs else "neither"
    return f"semantic ({right} agrees with Vixie)", detail


def _first(fires: list[dt.datetime]) -> dt.datetime | None:
    return fires[0] if fires else None


def _iso(instant: dt.datetime | None) -> str:
    return "none" if instant is None else instant.strftime("%Y-%m-%dT%H:%M:%SZ")


def time_engines(cases: list[tuple[str, str, dt.datetime]], fires: int) -> dict[str, float]:
    usable = []
    for expression, zone, start in cases:
        try:
            upcoming(parse_cron(expression), zone, start, 1)
            CronSim(cronsim_expression(expression), start)
        except (CronError, CronSimError):
            continue
        usable.append((expression, zone, start, start.astimezone(ZoneInfo(zone))))
    results: dict[str, float] = {"cases_timed": len(usable)}

    began = time.perf_counter()
    for expression, zone, start, _ in usable:
        upcoming(parse_cron(expression), zone, start, 1)
    results["cronhook_us_per_next_fire"] = (time.perf_counter() - began) / len(usable) * 1e6
    began = time.perf_counter()
    for expression, _, _, local in usable:
        next(CronSim(cronsim_expression(expression), local), None)
    results["cronsim_us_per_next_fire"] = (time.perf_counter() - began) / len(usable) * 1e6

    began = time.perf_counter()
    for expression, zone, start, _ in usable:
        upcoming(parse_cron(expression), zone, start, fires)
    results["cronhook_us_per_fire_in_sequence"] = (time.perf_counter() - began) / len(usable) / fires * 1e6
    began = time.perf_counter()
    for expression, _, _, local in usable:
        iterator = CronSim(cronsim_expression(expression), local)
        for _ in range(fires):
            if next(iterator, None) is None:
                break
    results["cronsim_us_per_fire_in_sequence"] = (time.perf_counter() - began) / len(usable) / fires * 1e6
    return {key: round(value, 1) for key, value in results.items()}


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--expressions", type=positive_int, default=300, help="curated plus random (default 300)")
    parser.add_argument("--starts", type=positive_int, default=4, help="start instants per expression and zone")
    parser.add_argument("--fires", type=positive_int, default=50, help="fire times compared per case")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--show", type=int, default=3, help="examples listed per class and expression")
    return parse_args(parser, argv, smoke={"expressions": 45, "starts": 1, "fires": 3})


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)

    cases = build_cases(random.Random(args.seed), args.expressions, args.starts)
    counts: collections.Counter[str] = collections.Counter()
    examples: dict[str, dict[str, list[str]]] = collections.defaultdict(dict)
    for expression, zone, start in cases:
        kind, detail = classify(expression, zone, start, args.fires)
        counts[kind] += 1
        if kind != "agree":
            listed = examples[kind].setdefault(expression, [])
            if len(listed) < args.show:
                listed.append(f"{zone} after {_iso(start)}: {detail}")

    for kind in sorted(examples):
        print(f"\n== {kind}: {counts[kind]} cases, {len(examples[kind])} expressions")
        for expression, listed in sorted(examples[kind].items()):
            if kind.endswith("refuses") or kind == "both-refuse":
                print(f"  {expression!r}: {listed[0].split(': ', 1)[1]}")
                continue
            print(f"  {expression!r}")
            for line in listed:
                print(f"      {line}")
    timings = time_engines(cases[:: max(1, len(cases) // 3000)], args.fires)
    print(f"\n{len(cases)} cases: " + ", ".join(f"{kind} {count}" for kind, count in counts.most_common()))
    print(
        f"per next fire: cronhook {timings['cronhook_us_per_next_fire']} us, "
        f"cronsim {timings['cronsim_us_per_next_fire']} us; per fire in a sequence of {args.fires}: "
        f"cronhook {timings['cronhook_us_per_fire_in_sequence']} us, "
        f"cronsim {timings['cronsim_us_per_fire_in_sequence']} us"
    )
    summary: dict[str, Any] = {
        "cases": len(cases),
        "expressions": args.expressions,
        "zones": len(ZONES) + len(EXTRA_ZONES),
        "fires_per_case": args.fires,
        "classes": dict(counts.most_common()),
        **timings,
    }
    print_result(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
