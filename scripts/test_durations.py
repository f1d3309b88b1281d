"""Where a test run's time went, by file: reads the JUnit XML of one pytest run and prints each file's summed
test time (setup, call and teardown), longest first, with the pass's total (docs/testing.md).

Usage: python scripts/test_durations.py RUN.xml [--top N]
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path


def seconds_by_file(junit_xml: Path) -> Counter[str]:
    totals: Counter[str] = Counter()
    for case in ElementTree.parse(junit_xml).iter("testcase"):
        totals[case.get("classname", "?").replace(".", "/") + ".py"] += float(case.get("time", 0))
    return totals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit_xml", type=Path, help="the file pytest --junitxml wrote")
    parser.add_argument("--top", type=int, default=25, help="how many files to print (default 25)")
    args = parser.parse_args(argv)
    try:
        totals = seconds_by_file(args.junit_xml)
    except (OSError, ElementTree.ParseError) as e:
        print(f"test_durations: cannot read {args.junit_xml} ({e}); pass the file pytest --junitxml wrote",
              file=sys.stderr)
        return 2
    for name, seconds in totals.most_common(args.top):
        print(f"{seconds:8.1f} s  {name}")
    print(f"{sum(totals.values()):8.1f} s  in all, {len(totals)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
