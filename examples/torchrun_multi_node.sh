#!/usr/bin/env bash
# Run the DLRM job on several machines with torchrun. Start this script on every machine with the
# same HEAD (host:port of one of them) and NNODES; checkpoints and the report need a shared folder.
#   HEAD=host0:29400 NNODES=2 NPROC=4 OUT=/shared/report ./examples/torchrun_multi_node.sh --steps 5000
set -euo pipefail
: "${HEAD:?set HEAD=host:port of the rendezvous machine}"
NNODES=${NNODES:-2}
NPROC=${NPROC:-2}
OUT=${OUT:-shardwise-report}
exec torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC" \
    --rdzv-backend c10d --rdzv-endpoint "$HEAD" --rdzv-id "${RDZV_ID:-shardwise-dlrm}" \
    -m shardwise.train.worker --out "$OUT" "$@"
