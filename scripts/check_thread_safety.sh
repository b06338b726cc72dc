#!/usr/bin/env bash
# Clang's thread-safety analysis over every project source: each field shared
# between threads carries ABSL_GUARDED_BY and each function that needs a lock
# says so; a violation fails (-Werror=thread-safety). Uses the compile
# commands of an existing build (scripts/build.sh writes build/), compiling
# with clang++ -fsyntax-only, so no second build is made.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
DB="$BUILD/compile_commands.json"
[ -f "$DB" ] || { echo "check_thread_safety: no $DB (run scripts/build.sh first)" >&2; exit 2; }
/usr/bin/python3 - "$DB" "$(pwd)" <<'PYEOF'
import json, os, shlex, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
db, root = json.load(open(sys.argv[1])), sys.argv[2]
jobs = []
for e in db:
    f = os.path.realpath(e["file"])
    rel = os.path.relpath(f, root)
    if not f.endswith(".cc") or rel.startswith(("build", "tests/", "benchmarks/", "fuzz/")):
        continue
    args = shlex.split(e["command"]) if "command" in e else e["arguments"]
    keep = [a for a in args[1:] if a.startswith(("-I", "-D", "-std=", "-isystem")) or a == "-pthread"]
    # -isystem takes its path as the next argument.
    for i, a in enumerate(args[1:]):
        if a == "-isystem":
            keep += [a, args[i + 2]]
    jobs.append((rel, ["clang++", "-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety",
                       "-Wno-unknown-warning-option", *keep, f]))
def run(job):
    rel, cmd = job
    p = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    return rel, p.returncode, p.stderr
failed = 0
with ThreadPoolExecutor(max_workers=os.cpu_count()) as ex:
    for rel, code, err in ex.map(run, jobs):
        if code != 0:
            failed += 1
            print(f"--- {rel}\n{err}", file=sys.stderr)
print(f"check_thread_safety: {len(jobs)} files, {failed} with errors")
sys.exit(1 if failed else 0)
PYEOF
