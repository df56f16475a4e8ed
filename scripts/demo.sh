#!/usr/bin/env bash
# The demo: installs what is missing, builds, writes the built-in default model (a tiny random
# Qwen3 with a sentencepiece tokenizer trained on this repository), starts the mesh on CPU and
# serves until Ctrl-C.
set -euo pipefail
source "$(dirname "$0")/common.sh"
PORT="${PORT:-8080}"

"$GARDEN_ROOT/scripts/install-deps.sh"
garden_build ivy tulip rose rose-mkmodel

MODEL_DIR="${MODEL_DIR:-$GARDEN_ROOT/models/default}"
if [ ! -f "$MODEL_DIR/config.json" ]; then
  "$BUILD_DIR/services/rose/rose-mkmodel" --out "$MODEL_DIR" --repo "$GARDEN_ROOT"
fi

cat <<MSG

  Garden demo mesh (ivy :$PORT -> tulip :50051 -> rose on CPU), model: $MODEL_DIR
  The default model has random weights: its embeddings are meaningless, the plumbing is real.

  Try:
    curl -s localhost:$PORT/v1/embeddings -H 'Content-Type: application/json' \\
      -d '{"model":"default","input":["hello garden","a second text"]}'
    curl -s localhost:$PORT/v1/models
    curl -s localhost:$PORT/metrics | head

MSG
exec "$GARDEN_ROOT/scripts/mesh.sh" --model "$MODEL_DIR" --port "$PORT" --device cpu --name default
