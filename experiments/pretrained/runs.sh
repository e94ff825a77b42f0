# Sourced by the study scripts (transfer_tweets.sh, transfer_imdb.sh), which set `out` (the output
# directory) and `common` (the arguments every run shares).
#   run NAME SEED ARGS...  trains $out/NAME_sSEED once: a finished run is skipped, a run in
#                          progress is locked (flock) so that copies sharing $out (e.g. one per
#                          core under `taskset -c N`) pass it by; output appends to
#                          $out/NAME_sSEED.log, wall seconds go to $out/times.tsv, and a failed
#                          run stops the script with its exit status.
finished() { [ -f "$1/metrics.jsonl" ] && grep -q test/params_from_step "$1/metrics.jsonl"; }  # (the final report)
run() {
  local name=$1 seed=$2 lock start rc; shift 2
  local dir="$out/${name}_s$seed"
  finished "$dir" && return
  exec {lock}>"$dir.lock"
  if flock -n "$lock" && ! finished "$dir"; then
    start=$SECONDS
    python -m textattn.main "${common[@]}" --workdir="$dir" --config.seed="$seed" "$@" \
      >> "$dir.log" 2>&1 || { rc=$?; exec {lock}>&-; exit $rc; }
    echo "${name}_s$seed $((SECONDS - start))" >> "$out/times.tsv"
  fi
  exec {lock}>&-
}
