#!/bin/bash
# axoplan export, rank 1: llama3.1-70B on 1024 x NVIDIA GB200 (B200 186GB) (gb200-nvl72), 256 nodes
# layout Gx=2 Gy=4 Gz=8 Gdata=16, tensor-parallel order xyz; axonn.init(G_inter=1 G_data=16 G_intra_r=4 G_intra_c=2 G_intra_d=8)
# micro-batch 8, no recompute, cached weights, 2 micro-batches per step; global batch 2048 x 2048 tokens
# predicted 2.450 s/iteration x 100 iterations + 10 min margin = wall time 00:15:00
# memory per GPU: needs 40.0 GB of tensors, of 160.6 GB usable (186 GB HBM less a 25.4 GB reserve); with the reserve 65.4 GB, 80% interval 57.5-74.3 GB: fits (P(fit) 1.00)
# plan 250c21a9cddb; its launch config is plan.json, next to this script
# run from this folder on each of the 256 nodes at once:
#   MASTER_ADDR=<first node> NODE_RANK=<this node's place> bash job.sh

set -eo pipefail

export MASTER_ADDR="${MASTER_ADDR:?set MASTER_ADDR to the hostname of the node with NODE_RANK 0}"
export MASTER_PORT="${MASTER_PORT:-29500}"
export NODE_RANK="${NODE_RANK:?set NODE_RANK to the place of this node, the 18 nodes of a rack consecutive, rack by rack}"
export CUDA_DEVICE_MAX_CONNECTIONS="1"

source "<PYTHON_ENV>/bin/activate"

# the launch config, and the layout as variables for the payload (see docs/export.md)
export AXOPLAN_PLAN="${AXOPLAN_PLAN:-$PWD/plan.json}"
if [ ! -f "$AXOPLAN_PLAN" ]; then
    echo "job.sh: no launch config at $AXOPLAN_PLAN; submit from the folder holding plan.json, or set AXOPLAN_PLAN" >&2
    exit 1
fi
export AXOPLAN_PLAN_ID=250c21a9cddb
export AXOPLAN_G_INTER=1
export AXOPLAN_G_DATA=16
export AXOPLAN_G_INTRA_R=4
export AXOPLAN_G_INTRA_C=2
export AXOPLAN_G_INTRA_D=8
export AXOPLAN_TP_ORDER=c,r,d
export AXOPLAN_MICRO_BATCH=8
export AXOPLAN_GRAD_ACCUM_STEPS=2
export AXOPLAN_GLOBAL_BATCH=2048
export AXOPLAN_SEQ_LEN=2048
export AXOPLAN_RECOMPUTE=0
export AXOPLAN_CACHE_WEIGHTS=1
export AXOPLAN_ITERATIONS=100

torchrun --nnodes=256 --nproc-per-node=4 --node-rank="$NODE_RANK" --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" --no-python \
    python -u -m axoplan run "$AXOPLAN_PLAN"
