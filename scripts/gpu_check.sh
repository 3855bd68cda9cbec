#!/usr/bin/env bash
# The GPU check (scripts/gpu_check.py) for a GPU machine that has PyTorch and Triton but no vLLM
# and no network, in two steps:
#
#   here:   make vllm-src && scripts/gpu_check.sh prepare
#           (copies the few vLLM 0.33 files the checks import, ~170 KiB, to build/gpu-check/vllm)
#   there:  scripts/gpu_check.sh run [--out DIR]      (with build/gpu-check carried along)
#
# `run` writes every figure to DIR/gpu_check.json (default $OUT, else results/gpu-check) and
# every file the sections wrote to DIR/gpu_check-files.tar.gz, both rewritten after each section
# and nothing else under DIR (what a lent GPU machine brings back: at most 8 files, no more than
# two folders deep), and stops by itself within 5 minutes. Exit: 0 passed, 1 a check failed or a
# section broke (the JSON says which), 2 cannot run here, 124 stopped at the time limit.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
command=${1:-run}
[ $# -gt 0 ] && shift
case $command in
  prepare)
    exec "${PYTHON:-.venv/bin/python}" scripts/gpu_check.py prepare "$@"
    ;;
  run)
    export PYTHONUNBUFFERED=1
    timeout 295 "${PYTHON:-python3}" scripts/gpu_check.py run "$@"
    rc=$?
    if [ "$rc" -eq 124 ]; then
      echo "gpu_check: stopped at 295 s; the JSON holds the sections that finished" >&2
    fi
    exit "$rc"
    ;;
  *)
    echo "usage: scripts/gpu_check.sh prepare|run [options of scripts/gpu_check.py]" >&2
    exit 2
    ;;
esac
