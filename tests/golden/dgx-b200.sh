#!/bin/bash
# axoplan export, rank 1: llama3.1-70B on 1024 x NVIDIA B200-SXM-180GB (dgx-b200), 128 nodes
# layout Gx=1 Gy=2 Gz=64 Gdata=8, tensor-parallel order xyz; axonn.init(G_inter=1 G_data=8 G_intra_r=2 G_intra_c=1 G_intra_d=64)
# micro-batch 4, no recompute, cached weights, 1 micro-batch per step; global batch 2048 x 2048 tokens
# predicted 2.000 s/iteration x 100 iterations + 10 min margin = wall time 00:14:00
# memory per GPU: needs 40.0 GB of tensors, of 155.3 GB usable (180 GB HBM less a 24.7 GB reserve); with the reserve 64.7 GB, 80% interval 56.9-73.5 GB: fits (P(fit) 1.00)
# plan 186f08fd3d41; its launch config is plan.json, next to this script
# run from this folder on each of the 128 nodes at once:
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
export AXOPLAN_PLAN_ID=186f08fd3d41
export AXOPLAN_G_INTER=1
export AXOPLAN_G_DATA=8
export AXOPLAN_G_INTRA_R=2
export AXOPLAN_G_INTRA_C=1
export AXOPLAN_G_INTRA_D=64
export AXOPLAN_TP_ORDER=c,r,d
export AXOPLAN_MICRO_BATCH=4
export AXOPLAN_GRAD_ACCUM_STEPS=1
export AXOPLAN_GLOBAL_BATCH=2048
export AXOPLAN_SEQ_LEN=2048
export AXOPLAN_RECOMPUTE=0
export AXOPLAN_CACHE_WEIGHTS=1
export AXOPLAN_ITERATIONS=100

torchrun --nnodes=128 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id=axoplan-01-x1-y2-z64-d8 --no-python \
    python -u -m axoplan run "$AXOPLAN_PLAN"
