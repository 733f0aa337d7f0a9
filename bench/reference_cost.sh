#!/usr/bin/env bash
# What a P4 spec's reference run costs: the spec run twice in one work dir, the first making the reference,
# the second reusing it, each with an Inductor cache of its own (every run compiles cold, as on a new machine).
# Prints each step's seconds from evidence.json and the total without the reference's steps.
#   SPECPROBE_TARGET=gpu bench/reference_cost.sh specs/p4_smoke.yaml --set nproc=1
set -u
spec=$(realpath "$1"); shift
work=${WORK:-$(mktemp -d)}
summary() {
    python3 - "$1" <<'PY'
import json, sys
steps = json.load(open(sys.argv[1] + "/evidence.json"))["steps"]
own = ("reference", "reference_store", "leg2_vs_reference")
total = without = 0.0
for name, step in steps.items():
    s = step.get("seconds") or 0.0
    reused = bool((step.get("reference") or {}).get("reused_from"))
    total += 0.0 if reused else s
    without += 0.0 if reused or name in own or name.endswith("_vs_reference") else s
    print(f"  {name:24s} {step.get('status'):8s} {s:8.1f}{'  reused' if reused else ''}")
print(f"  total {total:.1f} s, without the reference {without:.1f} s: {total / without:.2f}x")
PY
}
for run in first rerun; do
    (cd "$work" && TORCHINDUCTOR_CACHE_DIR="$work/inductor-$run" engine run "$spec" "$@" --run-dir "$work/$run")
    echo "== $run (exit $?)"
    summary "$work/$run"
done
