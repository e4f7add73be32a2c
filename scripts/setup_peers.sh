#!/usr/bin/env bash
# Builds every peer environment the tests compare against (AllenNLP 2.10.1, allennlp 0.9.0's
# `allennlp elmo`, ELMoForManyLangs, Triton), in parallel, each sharing the checkout's .venv
# (scripts/peer_venv.sh); a ready one is kept. A peer that cannot be built is reported with its log
# and its tests skip, naming the script; this never fails the test run by itself.
# Usage: scripts/setup_peers.sh [LOG_DIR]   (default /tmp/peer-logs)
set -uo pipefail
DIR=$(cd "$(dirname "$0")" && pwd)
LOGS=${1:-/tmp/peer-logs}
mkdir -p "$LOGS"
start=$SECONDS
declare -A pids
for peer in allennlp allennlp09 elmoformanylangs triton; do
  "$DIR/setup_$peer.sh" > "$LOGS/$peer.log" 2>&1 &
  pids[$peer]=$!
done
for peer in "${!pids[@]}"; do
  if wait "${pids[$peer]}"; then
    echo "peer $peer: $(tail -1 "$LOGS/$peer.log")"
  else
    echo "peer $peer: NOT BUILT, its tests skip; see $LOGS/$peer.log:" >&2
    tail -5 "$LOGS/$peer.log" >&2
  fi
done
echo "peers: $((SECONDS - start)) s"
