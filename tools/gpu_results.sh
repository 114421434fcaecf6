#!/usr/bin/env bash
# The course's GPU results for results/, on a machine with an NVIDIA GPU whose Python already has
# torch (a workstation's .venv, or an image with torch preinstalled; no network needed):
#
#   COURSE_COMMIT=$(git rev-parse --short HEAD) bash tools/gpu_results.sh [PACK.tgz]
#
# 1. course-bench at this GPU's size profile -> results/<GPU>-<date>/ (bench.json, bench.png,
#    stdout.txt, command.txt)
# 2. course-profile on a Hugging Face GPT-2 from its config, offloading included (issue 21's CUDA
#    path) -> results/<GPU>-<date>/profile-gpt2.json
# 3. every lesson in a fresh kernel (tools/bench_lessons.py, at most LESSON_LIMIT s each) ->
#    results/lesson-timings-<GPU>-<date>/ with the executed notebooks under executed/
#
# PACK: a .tgz of everything written so far, rewritten after each step (for a machine that may be
# taken back at a time limit). PYTHON picks the interpreter (default python3).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LESSON_LIMIT=${LESSON_LIMIT:-100}
export PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error
gpu=${GPU_NAME:-$($PY -c "import torch; print(torch.cuda.get_device_name().replace(' ', '-'))")} || exit 2
day=$(date +%F)
run=results/$gpu-$day
lessons=results/lesson-timings-$gpu-$day
commit=${COURSE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export COURSE_COMMIT=$commit
mkdir -p "$run" "$lessons"
pack() { if [ -n "${1:-}" ]; then tar czf "$1" "$run" "$lessons"; fi; }

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $PY -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'python', sys.version.split()[0])"
} > "$run/machine.txt" 2>&1

echo "course-bench --out $run  # at $commit" > "$run/command.txt"
timeout 150 $PY -m course_utils.cli --out "$run" > "$run/stdout.txt" 2>&1
echo "course-bench exit $?" | tee -a "$run/stdout.txt"
pack "${1:-}"

echo "course-profile --hf-config gpt2 --n-layer 6 --seq-len 512 --out $run/profile-gpt2.json  # at $commit" \
  >> "$run/command.txt"
timeout 120 $PY -m course_utils.cli_profile --hf-config gpt2 --n-layer 6 --seq-len 512 \
  --out "$run/profile-gpt2.json" > "$run/profile-gpt2.txt" 2>&1
echo "course-profile exit $?" | tee -a "$run/profile-gpt2.txt"
pack "${1:-}"

timeout $((LESSON_LIMIT * 6)) $PY tools/bench_lessons.py notebooks/0[1-5]_*.ipynb --out "$lessons" \
  --limit "$LESSON_LIMIT" --save-executed "$lessons/executed"
echo "bench_lessons exit $?"
pack "${1:-}"
