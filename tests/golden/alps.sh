#!/bin/bash
# axoplan export, rank 1: 40B on 256 x NVIDIA GH200 (H100 96GB) (alps), 64 nodes
# layout Gx=4 Gy=4 Gz=4 Gdata=4, tensor-parallel order xyz; axonn.init(G_inter=1 G_data=4 G_intra_r=4 G_intra_c=4 G_intra_d=4)
# micro-batch 1, no recompute, cached weights, 128 micro-batches per step; global batch 2048 x 2048 tokens
# predicted 9.000 s/iteration x 100 iterations + 10 min margin = wall time 00:25:00
# memory per GPU: needs 40.0 GB of tensors, of 79.0 GB usable (96 GB HBM less a 17.0 GB reserve); with the reserve 57.0 GB, 80% interval 50.2-64.8 GB: fits (P(fit) 1.00)
# plan 63b83e27aae7; its launch config is plan.json, next to this script
# submit from this folder:  sbatch job.sh
#SBATCH --account=<ACCOUNT>
#SBATCH --partition=normal
#SBATCH --nodes=64
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-task=1
#SBATCH --cpus-per-task=72
#SBATCH --time=00:25:00
#SBATCH --job-name=axoplan-01-x4-y4-z4-d4
#SBATCH --output=%x-%j.out

set -eo pipefail

export NCCL_NET="AWS Libfabric"
export NCCL_NET_GDR_LEVEL="PHB"
export NCCL_CROSS_NIC="1"
export NCCL_PROTO="^LL128"
export FI_CXI_DEFAULT_CQ_SIZE="131072"
export FI_CXI_DEFAULT_TX_SIZE="16384"
export FI_CXI_DISABLE_HOST_REGISTER="1"
export FI_CXI_RX_MATCH_MODE="software"
export FI_MR_CACHE_MONITOR="userfaultfd"
export MPICH_GPU_SUPPORT_ENABLED="0"
export TORCH_NCCL_ASYNC_ERROR_HANDLING="1"
export CUDA_CACHE_DISABLE="1"
export CUDA_DEVICE_MAX_CONNECTIONS="1"
MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
export MASTER_ADDR
export MASTER_PORT="29500"

# the launch config, and the layout as variables for the payload (see docs/export.md)
export AXOPLAN_PLAN="${AXOPLAN_PLAN:-$PWD/plan.json}"
if [ ! -f "$AXOPLAN_PLAN" ]; then
    echo "job.sh: no launch config at $AXOPLAN_PLAN; submit from the folder holding plan.json, or set AXOPLAN_PLAN" >&2
    exit 1
fi
export AXOPLAN_PLAN_ID=63b83e27aae7
export AXOPLAN_G_INTER=1
export AXOPLAN_G_DATA=4
export AXOPLAN_G_INTRA_R=4
export AXOPLAN_G_INTRA_C=4
export AXOPLAN_G_INTRA_D=4
export AXOPLAN_TP_ORDER=c,r,d
export AXOPLAN_MICRO_BATCH=1
export AXOPLAN_GRAD_ACCUM_STEPS=128
export AXOPLAN_GLOBAL_BATCH=2048
export AXOPLAN_SEQ_LEN=2048
export AXOPLAN_RECOMPUTE=0
export AXOPLAN_CACHE_WEIGHTS=1
export AXOPLAN_ITERATIONS=100

# shellcheck disable=SC2016  # the quoted lines run, and expand, inside every task
srun -ul --environment="<CONTAINER>" \
    bash -c '
        export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID" WORLD_SIZE="$SLURM_NTASKS"
        source "<PYTHON_ENV>/bin/activate"
        exec "$@"' axoplan-task \
    python -u -m axoplan run "$AXOPLAN_PLAN"
