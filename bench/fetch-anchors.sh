#!/usr/bin/env bash
# Copies the peers that live beside the repository, not in it (shared/anchors/llmc: llm.c's and
# cuDNN frontend's sources with the run.sh that builds and runs them), into .anchors/llmc, which
# git ignores. Run it on the dev machine before a device call that runs bench/gpt2.sh: the GPU
# machine sees only the working tree, so that call carries .anchors (the device tool's carry).
#   usage: bench/fetch-anchors.sh [ANCHORS_DIR]     (default: ../shared/anchors beside the repository)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
src=${1:-$root/../shared/anchors}
for f in run.sh llmc.tgz cudnnfe.tgz; do
  [[ -f $src/llmc/$f ]] || {
    echo "fetch-anchors: no $src/llmc/$f (give the anchors folder: bench/fetch-anchors.sh /path/to/shared/anchors)" >&2
    exit 1
  }
done
dest=$root/.anchors/llmc
[[ -d $dest ]] && chmod -R u+w "$dest" && rm -rf "$dest"
mkdir -p "$root/.anchors"
cp -R "$src/llmc" "$dest"
chmod -R u+w "$dest"  # the anchors are read-only; the copy is ours to replace next time
echo "fetch-anchors: $(du -sh "$dest" | cut -f1) in .anchors/llmc (from $src/llmc); carry .anchors in the device call"
