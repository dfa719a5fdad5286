#!/usr/bin/env bash
# Fuzzes every target in fuzz/fuzz_targets/ for N seconds each (default 60)
# with libFuzzer on the nightly toolchain, then prints how many inputs each
# target ran. Exits non-zero if any target crashed (the crashing input is
# kept in fuzz/artifacts/<target>/; replay it with
# `cargo +nightly fuzz run <target> <file>`).
#
#   fuzz/run.sh [seconds-per-target]
#
# Installs cargo-fuzz when missing. Corpora grow in fuzz/corpus/<target>/
# (not committed), starting from the seeds in fuzz/seeds/<target>/.
set -euo pipefail
cd "$(dirname "$0")"

seconds="${1:-60}"
toolchain="${FUZZ_TOOLCHAIN:-nightly}"

if ! cargo "+$toolchain" --version >/dev/null 2>&1; then
  echo "the $toolchain toolchain is missing: rustup toolchain install $toolchain" >&2
  exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "==> installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi

targets=$(cargo "+$toolchain" fuzz list)
echo "==> building fuzz targets: $(echo $targets)"
cargo "+$toolchain" fuzz build

mkdir -p logs
failed=()
summary=()
for target in $targets; do
  mkdir -p "corpus/$target"
  if [ -d "seeds/$target" ]; then
    cp -n "seeds/$target"/* "corpus/$target"/ 2>/dev/null || true
  fi
  log="logs/$target.log"
  echo "==> fuzzing $target for ${seconds}s"
  status=0
  cargo "+$toolchain" fuzz run "$target" "corpus/$target" -- \
    -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1 || status=$?
  runs=$(grep -aoE 'stat::number_of_executed_units:[[:space:]]*[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1 || true)
  done_line=$(grep -aoE '#[0-9]+[[:space:]]+DONE.*' "$log" | tail -1 || true)
  if [ "$status" -ne 0 ]; then
    failed+=("$target")
    summary+=("$(printf '%-14s FAILED (exit %s) after %s runs; see fuzz/%s' "$target" "$status" "${runs:-?}" "$log")")
    tail -n 30 "$log" >&2
  else
    summary+=("$(printf '%-14s %12s runs   %s' "$target" "${runs:-?}" "$done_line")")
  fi
done

echo "==> fuzz summary (${seconds}s per target)"
printf '%s\n' "${summary[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "crashed: ${failed[*]}" >&2
  exit 1
fi
