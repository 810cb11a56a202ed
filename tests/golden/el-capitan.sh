#!/bin/bash
# axoplan export, rank 1: llama3.1-70B on 1024 x AMD Instinct MI300A (el-capitan), 256 nodes
# layout Gx=1 Gy=4 Gz=16 Gdata=16, tensor-parallel order xyz; axonn.init(G_inter=1 G_data=16 G_intra_r=4 G_intra_c=1 G_intra_d=16)
# micro-batch 8, no recompute, cached weights, 1 micro-batch per step; global batch 2048 x 2048 tokens
# predicted 8.800 s/iteration x 100 iterations + 10 min margin = wall time 25m
# memory per GPU: needs 40.0 GB of tensors, of 100.4 GB usable (128 GB HBM less a 27.6 GB reserve); with the reserve 67.6 GB, 80% interval 59.5-76.9 GB: fits (P(fit) 1.00)
# plan a57a21c83cb7; its launch config is plan.json, next to this script
# submit from this folder:  flux batch job.sh
# flux: -N 256
# flux: -n 1024
# flux: -g 1
# flux: -x
# flux: -q pbatch
# flux: -B <ACCOUNT>
# flux: -t 25m
# flux: --job-name=axoplan-01-x1-y4-z16-d16
# flux: --setattr=thp=always

set -eo pipefail

export HSA_XNACK="1"
export RCCL_PLUGIN_DIR="<NET_PLUGIN>"
export LD_LIBRARY_PATH="$RCCL_PLUGIN_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export HSA_FORCE_FINE_GRAIN_PCIE="1"
export NCCL_NET_GDR_LEVEL="PHB"
export NCCL_CROSS_NIC="1"
export NCCL_SOCKET_IFNAME="hsi0"
export FI_MR_CACHE_MONITOR="userfaultfd"
export FI_CXI_DISABLE_HOST_REGISTER="1"
export FI_CXI_DEFAULT_CQ_SIZE="131072"
export FI_CXI_DEFAULT_TX_SIZE="1024"
export FI_CXI_RX_MATCH_MODE="hybrid"
export FI_CXI_RDZV_PROTO="alt_read"
export FI_CXI_RDZV_EAGER_SIZE="0"
export FI_CXI_RDZV_THRESHOLD="0"
export FI_CXI_RDZV_GET_MIN="0"
export CUDA_DEVICE_MAX_CONNECTIONS="1"
export MIOPEN_USER_DB_PATH="/tmp/miopen-cache-$FLUX_ENCLOSING_ID"
export MIOPEN_CUSTOM_CACHE_DIR="$MIOPEN_USER_DB_PATH"
MASTER_ADDR="$(flux hostlist --nth=0 instance)"
export MASTER_ADDR
export MASTER_PORT="29500"

source "<PYTHON_ENV>/bin/activate"
if (( 256 > 1 )); then export NCCL_NET=OFI; if [[ ! -e "$RCCL_PLUGIN_DIR/librccl-net.so" ]]; then echo "job.sh: no RCCL network plugin librccl-net.so in $RCCL_PLUGIN_DIR, so RCCL could not use Slingshot; export again with --net-plugin set to the aws-ofi-rccl build for your PyTorch ROCm version" >&2; exit 1; fi; fi

# the launch config, and the layout as variables for the payload (see docs/export.md)
export AXOPLAN_PLAN="${AXOPLAN_PLAN:-$PWD/plan.json}"
if [ ! -f "$AXOPLAN_PLAN" ]; then
    echo "job.sh: no launch config at $AXOPLAN_PLAN; submit from the folder holding plan.json, or set AXOPLAN_PLAN" >&2
    exit 1
fi
export AXOPLAN_PLAN_ID=a57a21c83cb7
export AXOPLAN_G_INTER=1
export AXOPLAN_G_DATA=16
export AXOPLAN_G_INTRA_R=4
export AXOPLAN_G_INTRA_C=1
export AXOPLAN_G_INTRA_D=16
export AXOPLAN_TP_ORDER=c,r,d
export AXOPLAN_MICRO_BATCH=8
export AXOPLAN_GRAD_ACCUM_STEPS=1
export AXOPLAN_GLOBAL_BATCH=2048
export AXOPLAN_SEQ_LEN=2048
export AXOPLAN_RECOMPUTE=0
export AXOPLAN_CACHE_WEIGHTS=1
export AXOPLAN_ITERATIONS=100

# shellcheck disable=SC2016  # the quoted lines run, and expand, inside every task
flux run -N 256 -n 1024 -g 1 -o gpu-affinity=per-task --setattr=rdzv_get_en=0 \
    bash -c '
        export RANK="$FLUX_TASK_RANK" LOCAL_RANK="$FLUX_TASK_LOCAL_ID" WORLD_SIZE="$FLUX_JOB_SIZE"
        mkdir -p "$MIOPEN_USER_DB_PATH"
        exec "$@"' axoplan-task \
    python -u -m axoplan run "$AXOPLAN_PLAN"
