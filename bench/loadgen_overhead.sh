#!/usr/bin/env bash
# The load generator's own cost, measured with the null SUT (it completes every query inside
# issue_query, so all the time is the load generator's), the whole process pinned to one core:
#   offline      samples/s of one query of every sample          (target: >= 1M samples/s)
#   server       peak QPS whose p99 latency meets the bound, by the QPS search, at 10 ms and 1 ms,
#                and a fixed 100k QPS run with its p99               (target: >= 100k QPS)
#   single-stream  per-query overhead = 1 / queries per second     (target: < 20 us)
# Each figure is the median of REPEAT runs (min..max beside it). Quick preset: 1 s per run.
#
#   bench/loadgen_overhead.sh                 # build/cpu/src/cli/accelbench, core 0, 3 repeats
#   ACCELBENCH=path/to/accelbench CORE=2 REPEAT=5 bench/loadgen_overhead.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${ACCELBENCH:-build/cpu/src/cli/accelbench}
CORE=${CORE:-0}
REPEAT=${REPEAT:-3}
[[ -x $BIN ]] || { echo "no accelbench at $BIN (build it: cmake --preset cpu && cmake --build --preset cpu)" >&2; exit 2; }
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

run() {  # run NAME AXES... : REPEAT runs of the loadgen workload on the null SUT, pinned
  local name=$1; shift
  for i in $(seq "$REPEAT"); do
    taskset -c "$CORE" "$BIN" run loadgen --device cpu --axis sut=null --axis preset=quick "$@" \
      --out "$OUT/$name" --quiet > /dev/null
  done
}

run offline --axis scenario=offline
run server10 --axis scenario=server --axis latency_bound_ms=10
run server1 --axis scenario=server --axis latency_bound_ms=1
run server100k --axis scenario=server --axis target_qps=100000
run single --axis scenario=single-stream
run multi --axis scenario=multi-stream

echo "accelbench loadgen, null SUT, pinned to core $CORE (taskset -c $CORE), $REPEAT runs each, quick preset"
echo "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) logical CPUs"
python3 - "$OUT" <<'EOF'
import json, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1])

def records(name):
    recs = []
    for f in sorted((out / name / "runs").glob("*/points.jsonl")):
        recs += [json.loads(l) for l in f.read_text().splitlines() if l.strip()]
    return recs

def show(label, values, unit, fmt="{:,.0f}"):
    m = statistics.median(values)
    print(f"  {label:<52} {fmt.format(m):>14} {unit:<10} ({fmt.format(min(values))} .. {fmt.format(max(values))})")

def scen(r):
    return r["scenario"]

for name, label in (("offline", "offline"), ("server10", "server peak, p99 <= 10 ms"),
                    ("server1", "server peak, p99 <= 1 ms"), ("server100k", "server at 100,000 QPS"),
                    ("single", "single-stream"), ("multi", "multi-stream")):
    recs = records(name)
    verdicts = ",".join(scen(r)["result"] for r in recs)
    print(f"{label}: {verdicts}")
    if name == "offline":
        show("samples/s", [scen(r)["completed_samples_per_s"] for r in recs], "samples/s")
        show("samples in the query", [scen(r)["samples_issued"] for r in recs], "")
    elif name.startswith("server"):
        if name == "server100k":
            show("scheduled QPS", [scen(r)["scheduled_qps"] for r in recs], "queries/s")
        else:
            show("peak QPS (verified)", [scen(r)["search"]["peak_qps"] for r in recs], "queries/s")
        show("completed samples/s", [scen(r)["completed_samples_per_s"] for r in recs], "samples/s")
        show("p99 latency from scheduled time", [scen(r)["latency_s"]["p99"] * 1e6 for r in recs], "us", "{:,.2f}")
        show("mean issue lag", [scen(r)["issue_lag_s"]["mean"] * 1e6 for r in recs], "us", "{:,.3f}")
    else:
        qps = [scen(r)["completed_samples_per_s"] / (8 if name == "multi" else 1) for r in recs]
        show("queries/s", qps, "queries/s")
        show("per-query overhead (1 / queries/s)", [1e6 / q for q in qps], "us", "{:,.3f}")
        show("p99 latency (issue to completion)", [scen(r)["latency_s"]["p99"] * 1e6 for r in recs], "us", "{:,.3f}")
EOF
