#!/usr/bin/env bash
# A corpus for loss parity that a 500-step run reads less than once: the Python standard library's and
# torch's own source (tests left out), one document per file in byte order of the path, GPT-2's BPE.
# Training loss on it is a held-out loss throughout, where the embedded corpus repeats ~13 times in the
# same run and its training loss measures how fast a model memorizes. Built from what the machine has
# (no download); its file list, token counts and hashes are written beside it, since another Python or
# torch gives another corpus.
#
#   bash bench/code_corpus.sh DIR      # then: bench/loss_parity.py --both "$(cat DIR/keys)" ...
set -euo pipefail
DIR=${1:?usage: bash bench/code_corpus.sh DIR (the corpus is written there)}
PY=${PYTHON:-python3}
PREFIX=$DIR/pycode
if [ -f "$PREFIX"_text_document.idx ] && [ -f "$DIR/keys" ]; then
  echo "code corpus: $DIR already holds it (remove the directory to rebuild)" >&2
else
  mkdir -p "$DIR"
  STD=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
  TORCH=$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
  { find "$STD" -name '*.py' -not -path '*-packages/*' -not -path '*/test/*' -not -path '*/tests/*'
    find "$TORCH" -name '*.py' -not -path '*/test/*' -not -path '*/tests/*'; } | LC_ALL=C sort > "$DIR/files.tmp"
  mv "$DIR/files.tmp" "$DIR/files.txt"
  mapfile -t FILES < "$DIR/files.txt"
  "$PY" -m gptforge prepare --input "${FILES[@]}" --format text --tokenizer gpt2 --append-eod \
    --workers "$(nproc)" --output-prefix "$PREFIX" --json > "$DIR/prepare.tmp"
  mv "$DIR/prepare.tmp" "$DIR/prepare.json"
  (cd "$DIR" && sha256sum files.txt pycode_text_document.bin pycode_text_document.idx > sha256)
  echo "data-path=${PREFIX}_text_document,tokenizer-type=gpt2" > "$DIR/keys"
fi
"$PY" - "$DIR" <<'PY'
import json, sys
from pathlib import Path
d = json.loads((Path(sys.argv[1]) / "prepare.json").read_text())
print(f"code corpus: {d['documents']} files, {d['tokens']:,} tokens ({d['tokenizer']}, {d['tokenizer_engine']})")
PY
