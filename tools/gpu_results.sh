#!/usr/bin/env bash
# Everything the course runs on a GPU, in one call, for results/ (issue 25): on a machine with an
# NVIDIA GPU whose Python already has torch (a workstation's .venv, or a lent machine's image; no
# network needed: missing Jupyter packages can travel as wheels, see results/README.md):
#
#   COURSE_COMMIT=$(git rev-parse --short HEAD) bash tools/gpu_results.sh [PACK.tgz]
#
# Under results/<GPU>-<date>/, for each mode in $MODES ("native": the GPU's own recipe and size
# profile; "t4": the GPU standing in for a Colab T4, COURSE_STAND_IN=t4, its recipe, `t4` sizes
# and 14.75 GiB):
#   <mode>/notebooks-NN_name/   every lesson in a fresh kernel (tools/bench_lessons.py, at most
#                               $LESSON_LIMIT s): lesson-timings.json/.md, NN_name.txt (transcript)
#   <mode>/solutions-NN_name/   every exercise solution through the grader (course-grade grade
#                               --no-sandbox --memory 0: CUDA maps more address space than any
#                               RLIMIT_AS the grader would set), at most $SOLUTION_LIMIT s:
#                               grade.json, grade.jsonl
#   <mode>/course-bench/        course-bench --out (bench.json, bench.png, stdout.txt)
#   <mode>/profile-gpt2.*, <mode>/profile-llama.*   course-profile on a GPT-2 and a Llama config
# Each item writes its files when it ends, and PACK (a .tgz of the run folder) is rewritten
# after each, so a run cut off keeps what it did. Run again with RERUN=failed to redo only the
# items without an "ok" (status.txt lists each item's status and seconds).
#
# Environment: MODES (default "native t4"), JOBS (notebooks run at once, default 1: timings are
# only comparable at 1), LESSON_LIMIT (default 60), SOLUTION_LIMIT (default 30), ONLY (a regex
# on the item names, e.g. "notebooks-0[25]"), SKIP_BENCH=1, SKIP_PROFILE=1, PYTHON.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
MODES=${MODES:-native t4}
JOBS=${JOBS:-1}
LESSON_LIMIT=${LESSON_LIMIT:-60}
SOLUTION_LIMIT=${SOLUTION_LIMIT:-30}
ONLY=${ONLY:-.}
RERUN=${RERUN:-}
PACK=${1:-}
export PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1
gpu=${GPU_NAME:-$($PY -c "import torch; print(torch.cuda.get_device_name().replace(' ', '-'))")} || exit 2
run=${RUN_DIR:-results/$gpu-$(date +%F)}
commit=${COURSE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export COURSE_COMMIT=$commit
mkdir -p "$run"
touch "$run/status.txt"

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $PY -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'python', sys.version.split()[0])"
  echo "commit $commit; MODES=$MODES JOBS=$JOBS LESSON_LIMIT=$LESSON_LIMIT SOLUTION_LIMIT=$SOLUTION_LIMIT"
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

for mode in $MODES; do
  mode_env "$mode" > /dev/null || exit 2
  echo "bash tools/gpu_results.sh  # MODES=$MODES JOBS=$JOBS at $commit" > "$run/command.txt"
  items=()
  for nb in notebooks/0[1-9]_*.ipynb; do items+=("lesson $nb"); done
  for nb in solutions/0[1-9]_*.ipynb; do items+=("solution $nb"); done
  running=0
  for it in "${items[@]}"; do
    set -- $it
    kind=$([ "$1" = lesson ] && echo notebooks || echo solutions)
    item "$mode/$kind-$(basename "$2" .ipynb)" "$1" "$mode" "$2" &
    running=$((running + 1))
    if [ "$running" -ge "$JOBS" ]; then wait -n; running=$((running - 1)); fi
  done
  wait
  [ -z "${SKIP_BENCH:-}" ] && item "$mode/course-bench" bench "$mode"
  if [ -z "${SKIP_PROFILE:-}" ]; then
    item "$mode/profile-gpt2" profile "$mode" gpt2 --hf-config gpt2 --n-layer 4 --seq-len 512
    item "$mode/profile-llama" profile "$mode" llama --hf-config llama --n-layer 4 --d-model 1024 \
      --n-head 16 --seq-len 512
  fi
done
pack
cat "$run/status.txt"
! grep -qv " ok " "$run/status.txt"
