#!/usr/bin/env bash
# Builds the Debian package of a configured and built preset (default: cpu), unpacks it into a
# scratch root (dpkg -x: no root needed, nothing installed on the machine) and runs the unpacked
# binary from outside the source tree: `accelbench list`, then the quick suite it ships, timed
# short (the suite's steps and points, not its figures, are what is checked here).
#   scripts/package-test.sh [PRESET]
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-cpu}
build=build/$preset
[[ -f $build/CPackConfig.cmake ]] || { echo "package-test: $build is not configured (cmake --preset $preset)" >&2; exit 2; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cpack --config "$build/CPackConfig.cmake" -B "$scratch/package" >/dev/null
debs=("$scratch"/package/*.deb)
[[ -f ${debs[0]} ]] || { echo "package-test: cpack wrote no .deb" >&2; exit 1; }
echo "package: $(basename "${debs[0]}") ($(du -h "${debs[0]}" | cut -f1)), depends: $(dpkg-deb -f "${debs[0]}" Depends)"
dpkg -x "${debs[0]}" "$scratch/root"
bin=$(find "$scratch/root" -path '*/bin/accelbench' | head -1)
suites=$(find "$scratch/root" -type d -path '*/share/accelbench/suites' | head -1)
[[ -x $bin && -f $suites/quick.yaml ]] || { echo "package-test: no bin/accelbench or share/accelbench/suites/quick.yaml in the package" >&2; exit 1; }
[[ -f $(dirname "$suites")/../doc/accelbench/README.md ]] || { echo "package-test: the package holds no README" >&2; exit 1; }
cd "$scratch"  # nothing of the source tree is in reach
"$bin" list >list.txt
grep -q 'ceilings' list.txt || { echo "package-test: 'accelbench list' names no workload" >&2; exit 1; }
"$bin" run "$suites/quick.yaml" --out "$scratch/runs" --min-time 0 --max-noise 100 --timeout 5 >run.txt 2>&1 ||
  { cat run.txt; echo "package-test: the unpacked quick suite failed" >&2; exit 1; }
[[ -n $(find "$scratch/runs" -name accelbench.db -size +0) ]] || { echo "package-test: the run stored nothing" >&2; exit 1; }
echo "package-test: the unpacked package lists its workloads and runs the quick suite ($(grep -c '' run.txt) lines of output)"
