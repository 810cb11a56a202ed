#!/bin/bash
# axoplan export, rank 1: 80B on 128 x NVIDIA H100-SXM5-80GB (dgx-h100), 16 nodes
# layout Gx=8 Gy=1 Gz=4 Gdata=4, tensor-parallel order xyz; axonn.init(G_inter=1 G_data=4 G_intra_r=1 G_intra_c=8 G_intra_d=4)
# micro-batch 2, no recompute, cached weights, 64 micro-batches per step; global batch 2048 x 2048 tokens
# predicted 20.000 s/iteration x 100 iterations + 10 min margin = wall time 00:44:00
# memory per GPU: needs 40.0 GB of tensors, of 66.8 GB usable (80 GB HBM less a 13.2 GB reserve); with the reserve 53.2 GB, 80% interval 46.8-60.5 GB: fits (P(fit) 1.00)
# plan ef3cea44b552; its launch config is plan.json, next to this script
# run from this folder on each of the 16 nodes at once:
#   MASTER_ADDR=<first node> bash job.sh

set -eo pipefail

export MASTER_ADDR="${MASTER_ADDR:?set MASTER_ADDR to the hostname of the first node}"
export MASTER_PORT="${MASTER_PORT:-29500}"
export CUDA_DEVICE_MAX_CONNECTIONS="1"

source "<PYTHON_ENV>/bin/activate"

# the launch config, and the layout as variables for the payload (see docs/export.md)
export AXOPLAN_PLAN="${AXOPLAN_PLAN:-$PWD/plan.json}"
if [ ! -f "$AXOPLAN_PLAN" ]; then
    echo "job.sh: no launch config at $AXOPLAN_PLAN; submit from the folder holding plan.json, or set AXOPLAN_PLAN" >&2
    exit 1
fi
export AXOPLAN_PLAN_ID=ef3cea44b552
export AXOPLAN_G_INTER=1
export AXOPLAN_G_DATA=4
export AXOPLAN_G_INTRA_R=1
export AXOPLAN_G_INTRA_C=8
export AXOPLAN_G_INTRA_D=4
export AXOPLAN_TP_ORDER=c,r,d
export AXOPLAN_MICRO_BATCH=2
export AXOPLAN_GRAD_ACCUM_STEPS=64
export AXOPLAN_GLOBAL_BATCH=2048
export AXOPLAN_SEQ_LEN=2048
export AXOPLAN_RECOMPUTE=0
export AXOPLAN_CACHE_WEIGHTS=1
export AXOPLAN_ITERATIONS=100

torchrun --nnodes=16 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id=axoplan-01-x8-y1-z4-d4 --no-python \
    python -u -m axoplan run "$AXOPLAN_PLAN"
