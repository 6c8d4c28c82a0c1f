#!/usr/bin/env bash
# Every libFuzzer target in <fuzz dir>/fuzz for SECONDS each, JOBS at a time (one per core):
# seeds from engine/fuzz/corpus/<name>, discoveries in <fuzz dir>/work/<name> with its log
# beside it, a crashing input in <fuzz dir>/crashes/. Exit 1 on any finding.
set -uo pipefail
dir=$1 seconds=$2 jobs=${3:-$(nproc)}
mkdir -p "$dir/crashes"

one() {
  local bin=$1 dir=$2 seconds=$3
  local name=${bin##*/fuzz_} work="$dir/work/${bin##*/fuzz_}"
  mkdir -p "$work" "engine/fuzz/corpus/$name"
  if ! "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -artifact_prefix="$dir/crashes/$name-" -print_final_stats=1 \
    "$work" "engine/fuzz/corpus/$name" >"$work.log" 2>&1; then
    tail -n 40 "$work.log"
    echo "[fuzz] $name FAILED (log: $work.log)"
    return 1
  fi
  echo "[fuzz] $name: $(grep -h number_of_executed_units "$work.log" | tr -s ' ' | cut -d' ' -f2) runs in $seconds s, no finding"
}
export -f one

targets=("$dir"/fuzz/fuzz_*)
[[ -x ${targets[0]} ]] || { echo "[fuzz] no targets in $dir/fuzz: build them first" >&2; exit 1; }
printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -I{} bash -c 'one "$@"' _ {} "$dir" "$seconds"
