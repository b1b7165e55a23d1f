# Sourced by bench/gpt2.sh and bench/bert.sh: each part of a comparison is a step with its own
# time limit and log, shown as it runs; a step that fails or times out is reported and the next
# one runs, and `finish` makes the exit status say whether any failed.
# The caller sets out (the log folder), dry_run (1: print the steps, run none) and skip.
# shellcheck shell=bash disable=SC2154
failed=()

# step NAME LIMIT_S CMD...: CMD under a time limit, its output shown and kept in $out/NAME.log;
# with quiet=1 (quiet=1 step ...) only kept, and its last lines shown at the end.
step() {
  local name=$1 limit=$2 rc start=$SECONDS
  shift 2
  echo "== $name (limit ${limit} s): $*"
  [[ $dry_run == 1 ]] && return 0
  if [[ ${quiet:-0} == 1 ]]; then
    timeout -k 10 "$limit" "$@" > "$out/$name.log" 2>&1
    rc=$?
    tail -n 3 "$out/$name.log" | sed 's/^/   /'
  else
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$out/$name.log"
    rc=${PIPESTATUS[0]}
  fi
  case $rc in
    0) echo "== $name: ok, $((SECONDS - start)) s" ;;
    124 | 137) echo "== $name: TIMED OUT after $limit s (log: $out/$name.log)"; failed+=("$name") ;;
    *) echo "== $name: FAILED with exit $rc (log: $out/$name.log)"; failed+=("$name") ;;
  esac
  return "$rc"
}

# refuse NAME REASON...: a step that cannot start, with the reason.
refuse() {
  local name=$1
  shift
  echo "== $name: NOT RUN: $*"
  failed+=("$name")
}

# skipped NAME: whether --skip listed NAME (the caller's comma-separated $skip).
skipped() { [[ ,$skip, == *,$1,* ]]; }

# accelbench_step NAME LIMIT_S BINARY ARGS...: `BINARY run ARGS --out $out/accelbench`; where it
# fails its last lines are repeated, and the comparison goes on with the peers alone.
accelbench_step() {
  local name=$1 limit=$2 binary=$3
  shift 3
  if [[ $dry_run != 1 && ! -x $binary ]]; then
    refuse "$name" "no accelbench binary at $binary (build the cuda preset, or give --accelbench PATH)"
    return
  fi
  if ! step "$name" "$limit" "$binary" run "$@" --out "$out/accelbench"; then
    echo "== $name: accelbench's last lines:"
    tail -n 8 "$out/$name.log" | sed 's/^/   /'
  fi
}

# The GPU's name for the table's title; fails where there is none (dry runs excepted), and the
# caller stops: gpu=$(gpu_name) || exit 1.
gpu_name() {
  local name
  if ! name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1) || [[ -z $name ]]; then
    [[ $dry_run == 1 ]] && { echo "(dry run: no GPU)"; return; }
    echo "no GPU (nvidia-smi finds none): run this on the GPU machine (scripts/device.sh bench ...)" >&2
    return 1
  fi
  echo "$name"
}

finish() {
  if [[ ${#failed[@]} -gt 0 ]]; then
    echo "== failed: ${failed[*]} (logs in $out)"
    exit 1
  fi
  echo "== every step ran (logs in $out)"
}
