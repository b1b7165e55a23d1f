#!/usr/bin/env bash
# Checks that the C++/CUDA lines changed since a base commit follow .clang-format, and fails with
# the diff that would fix them. Only changed lines are checked: the tree is not reformatted.
#   usage: scripts/format-check.sh [REF]
# Base: the merge-base of HEAD and REF when REF is given (e.g. origin/main), else HEAD~1. The
# working tree's uncommitted changes count as changed too. Needs git clang-format (Debian's
# clang-format package; scripts/install-deps.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v git-clang-format >/dev/null 2>&1 || { echo "format-check: git-clang-format not found (apt-get install clang-format)" >&2; exit 2; }
if [[ $# -gt 0 ]]; then
  base=$(git merge-base HEAD "$1") || { echo "format-check: no merge-base of HEAD and '$1'" >&2; exit 2; }
else
  base=$(git rev-parse --verify --quiet HEAD~1) || { echo "format-check: HEAD has no parent (a shallow clone?); give a REF" >&2; exit 2; }
fi
# git clang-format exits 0 whether or not it finds a diff (clang-format 14), so read its output.
out=$(git clang-format --diff --extensions c,h,cc,cpp,hpp,cu,cuh "$base" -- 2>&1) || { echo "$out" >&2; exit 2; }
if grep -q '^diff --git' <<<"$out"; then
  echo "$out"
  echo "format-check: lines changed since ${base:0:12} differ from .clang-format (above: the diff that fixes them;" \
       "git clang-format $base applies it)" >&2
  exit 1
fi
echo "format-check: changed lines since ${base:0:12} follow .clang-format"
