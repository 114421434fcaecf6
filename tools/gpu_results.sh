#!/usr/bin/env bash
# Everything the course runs on a GPU, in one call, for results/ (issue 25): on a machine with an
# NVIDIA GPU whose Python already has torch (a workstation's .venv, or a lent machine's image; no
# network needed: the Jupyter packages it lacks travel as wheels in .whl/, installed first when
# that folder exists; results/README.md says how to fill it):
#
#   COURSE_COMMIT=$(git rev-parse --short HEAD) bash tools/gpu_results.sh [PACK.tgz]
#
# Two modes: "native" (the GPU's own recipe and size profile) and "t4" (the GPU standing in for a
# Colab T4: COURSE_STAND_IN=t4, its recipe, `t4` sizes and 14.75 GiB; not its speed). Two stages:
#   1. busy: at most $JOBS items at once, whose times are not the point: the stand-in's lessons
#      and solutions (a stand-in's times are not a T4's anyway), every solution at the native
#      profile (graded, not timed), the stand-in's course-bench, and course-profile on a GPT-2
#      and a Llama configuration in both modes;
#   2. quiet: one at a time, the timings that are reported: every lesson at the native profile,
#      then the native course-bench.
# Under results/<GPU>-<date>/<mode>/ (items written when each ends; PACK, a .tgz of the run folder,
# rewritten after each, so a run cut off keeps what it did):
#   notebooks-NN_name/   tools/bench_lessons.py, at most $LESSON_LIMIT s: lesson-timings.json/.md,
#                        NN_name.txt (the transcript: every cell's text output)
#   solutions-NN_name/   course-grade grade --no-sandbox --memory 0 (CUDA maps more address space
#                        than the grader's RLIMIT_AS default), at most $SOLUTION_LIMIT s: grade.json
#   course-bench/        course-bench --out (bench.json, bench.png, stdout.txt)
#   profile-gpt2.*, profile-llama.*   course-profile --out
# status.txt lists each item's status and seconds; run again with RERUN=failed to redo only the
# items without an "ok".
#
# Environment: JOBS (stage 1's items at once, default 12), LESSON_LIMIT (default 75),
# SOLUTION_LIMIT (default 45), ONLY (a regex on item names, e.g. "notebooks-0[25]"), STAGES
# (default "busy quiet"), RUN_DIR, GPU_NAME, PYTHON.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
JOBS=${JOBS:-12}
STAGES=${STAGES:-busy quiet}
LESSON_LIMIT=${LESSON_LIMIT:-75}
SOLUTION_LIMIT=${SOLUTION_LIMIT:-45}
ONLY=${ONLY:-.}
RERUN=${RERUN:-}
PACK=${1:-}
export PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1
if [ -d .whl ] && ! $PY -c "import nbclient, ipykernel" 2>/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/course-site .whl/*.whl || exit 2
  export PYTHONPATH=/tmp/course-site:$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
gpu=${GPU_NAME:-$($PY -c "import torch; print(torch.cuda.get_device_name().replace(' ', '-'))")} || exit 2
run=${RUN_DIR:-results/$gpu-$(date +%F)}
commit=${COURSE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export COURSE_COMMIT=$commit
mkdir -p "$run"
touch "$run/status.txt"

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $PY -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'python', sys.version.split()[0])"
  echo "commit $commit; STAGES=$STAGES JOBS=$JOBS LESSON_LIMIT=$LESSON_LIMIT SOLUTION_LIMIT=$SOLUTION_LIMIT"
} > "$run/machine.txt" 2>&1

pack() { if [ -n "$PACK" ]; then tar czf "$PACK.tmp" "$run" && mv "$PACK.tmp" "$PACK"; fi; }

mode_env() {  # the environment of one mode
  case $1 in
    native) echo "COURSE_STAND_IN=" ;;
    t4) echo "COURSE_STAND_IN=t4 COURSE_SIZE=t4" ;;
    *) echo "gpu_results: unknown mode $1" >&2; return 1 ;;
  esac
}

done_ok() { grep -q "^$1 ok " "$run/status.txt"; }

# One item: NAME COMMAND... ; its status line (NAME ok|exit N SECONDS) goes to status.txt.
item() {
  local name=$1; shift
  if ! [[ $name =~ $ONLY ]]; then return 0; fi
  if [ "$RERUN" = failed ] && done_ok "$name"; then return 0; fi
  local t0=$SECONDS rc
  "$@"; rc=$?
  local status=ok; [ $rc -ne 0 ] && status="exit-$rc"
  (  # items may run at once (JOBS): one writer of status.txt and the pack at a time
    flock 9
    sed -i "\#^$name #d" "$run/status.txt"
    echo "$name $status $((SECONDS - t0))s" >> "$run/status.txt"
    echo "[$(date +%T)] $name: $status in $((SECONDS - t0)) s"
    pack
  ) 9> "$run/.lock"
}

lesson() {  # MODE NOTEBOOK
  local dir=$run/$1/notebooks-$(basename "$2" .ipynb)
  mkdir -p "$dir"
  env $(mode_env "$1") timeout $((LESSON_LIMIT + 120)) $PY tools/bench_lessons.py "$2" --out "$dir" \
    --limit "$LESSON_LIMIT" --save-executed "$dir/executed" > "$dir/stdout.txt" 2>&1
  local rc=$?
  # the transcript up to the run folder's depth (results come back at most two folders down)
  cp "$dir"/executed/*/*.txt "$dir/" 2>/dev/null
  return $rc
}

solution() {  # MODE NOTEBOOK
  local dir=$run/$1/solutions-$(basename "$2" .ipynb) size
  mkdir -p "$dir"
  size=$([ "$1" = t4 ] && echo t4 || $PY -c "from course_utils.config import size_profile; print(size_profile())")
  env $(mode_env "$1") COURSE_SIZE="$size" timeout $((SOLUTION_LIMIT + 120)) \
    $PY -m course_grade grade "$2" --no-sandbox --memory 0 --timeout "$SOLUTION_LIMIT" \
    --json --log "$dir/grade.jsonl" > "$dir/grade.json" 2> "$dir/stderr.txt" || return
  # graded is not enough: a solution must earn every point
  $PY -c "import json, sys; r = json.load(open(sys.argv[1])); sys.exit(any(t['status'] != 'pass'
for s in r for t in s['tests']))" "$dir/grade.json"
}

bench() {  # MODE
  local dir=$run/$1/course-bench
  mkdir -p "$dir"
  env $(mode_env "$1") timeout 150 $PY -m course_utils.cli --out "$dir" > "$dir/stdout.txt" 2>&1
}

profile() {  # MODE NAME ARGS...
  local mode=$1 name=$2; shift 2
  mkdir -p "$run/$mode"
  env $(mode_env "$mode") timeout 150 $PY -m course_utils.cli_profile "$@" \
    --out "$run/$mode/profile-$name.json" > "$run/$mode/profile-$name.txt" 2>&1
}

# Items as "NAME FUNCTION ARGS..." lines; run_items JOBS runs them, at most JOBS at once.
run_items() {
  local jobs=$1 running=0 line
  while read -r line; do
    [ -z "$line" ] && continue
    set -- $line
    item "$@" &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
  done
  wait
}

nb_items() {  # MODE KIND(lesson|solution) FOLDER
  for nb in "$3"/0[1-9]_*.ipynb; do echo "$1/$3-$(basename "$nb" .ipynb) $2 $1 $nb"; done
}

profile_items() {  # MODE
  echo "$1/profile-gpt2 profile $1 gpt2 --hf-config gpt2 --n-layer 4 --seq-len 512"
  echo "$1/profile-llama profile $1 llama --hf-config llama --n-layer 4 --d-model 1024 --n-head 16 --seq-len 512"
}

echo "bash tools/gpu_results.sh  # STAGES='$STAGES' JOBS=$JOBS at $commit" >> "$run/command.txt"
for stage in $STAGES; do
  case $stage in
    busy) { nb_items t4 lesson notebooks; nb_items t4 solution solutions
            nb_items native solution solutions; echo "t4/course-bench bench t4"
            profile_items t4; profile_items native; } | run_items "$JOBS" ;;
    quiet) { nb_items native lesson notebooks; echo "native/course-bench bench native"; } \
             | run_items 1 ;;
    *) echo "gpu_results: unknown stage $stage (busy, quiet)" >&2; exit 2 ;;
  esac
done
rm -f "$run/.lock"
pack
cat "$run/status.txt"
! grep -qv " ok " "$run/status.txt"
