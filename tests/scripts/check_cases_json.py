#!/usr/bin/env python3
"""Checks the JSON scripts/run-test-cases.sh wrote: check_cases_json.py FILE NAME=STATUS[|STATUS]...

Each NAME=STATUS names one case, in the listed order, and the statuses it may have; the file must list exactly
these cases, count them consistently and be "passed" only when every case passed. Exits 1 naming the mismatch."""
import json
import sys

path, expected = sys.argv[1], [a.split("=", 1) for a in sys.argv[2:]]
with open(path) as f:
    doc = json.load(f)
results = doc["results"]
problems = []
if [r["name"] for r in results] != [n for n, _ in expected]:
    problems.append(f"cases {[r['name'] for r in results]} != {[n for n, _ in expected]}")
for r, (name, statuses) in zip(results, expected):
    if r["status"] not in statuses.split("|"):
        problems.append(f"'{name}': status '{r['status']}' ({r['detail']}), expected {statuses}")
counts = {s: sum(r["status"] == s for r in results) for s in
          ("passed", "failed", "crashed", "timeout", "skipped", "not found", "not run")}
for key, status in (("passed", "passed"), ("failed", "failed"), ("crashed", "crashed"), ("timeout", "timeout"),
                    ("skipped", "skipped"), ("not_found", "not found"), ("not_run", "not run")):
    if doc[key] != counts[status]:
        problems.append(f"count {key} = {doc[key]}, but {counts[status]} cases have that status")
if doc["cases"] != len(results):
    problems.append(f"cases = {doc['cases']}, but {len(results)} results")
if doc["status"] != ("passed" if counts["passed"] == len(results) else "failed"):
    problems.append(f"overall status '{doc['status']}' with {counts['passed']} of {len(results)} passed")
if problems:
    sys.exit(f"{path}:\n  " + "\n  ".join(problems))
print(f"{path}: {len(results)} cases as expected")
