#!/bin/bash
# axoplan export, rank 1: 20B on 256 x AMD MI250X GCD (lumi-g), 32 nodes
# layout Gx=4 Gy=1 Gz=8 Gdata=8, tensor-parallel order xyz; axonn.init(G_inter=1 G_data=8 G_intra_r=1 G_intra_c=4 G_intra_d=8)
# micro-batch 2, no recompute, cached weights, 16 micro-batches per step; global batch 2048 x 2048 tokens
# predicted 7.250 s/iteration x 100 iterations + 10 min margin = wall time 00:23:00
# memory per GPU: needs 40.0 GB of tensors, of 51.7 GB usable (64 GB HBM less a 12.3 GB reserve); with the reserve 52.3 GB, 80% interval 46.0-59.4 GB: fits (P(fit) 0.98)
# plan d748ace1cb89; its launch config is plan.json, next to this script
# submit from this folder:  sbatch job.sh
#SBATCH --account=<ACCOUNT>
#SBATCH --partition=standard-g
#SBATCH --nodes=32
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=7
#SBATCH --time=00:23:00
#SBATCH --job-name=axoplan-01-x4-y1-z8-d8
#SBATCH --output=%x-%j.out

set -eo pipefail

module use /appl/local/laifs/modules
module load lumi-aif-singularity-bindings

export NCCL_SOCKET_IFNAME="hsn0,hsn1,hsn2,hsn3"
export NCCL_NET_GDR_LEVEL="PHB"
export NCCL_CROSS_NIC="1"
export CUDA_DEVICE_MAX_CONNECTIONS="1"
export MIOPEN_USER_DB_PATH="/tmp/miopen-config-$SLURM_JOB_ID"
export MIOPEN_CUSTOM_CACHE_DIR="/tmp/miopen-cache-$SLURM_JOB_ID"
MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
export MASTER_ADDR
export MASTER_PORT="1${SLURM_JOB_ID:0-4}"

if (( SLURM_JOB_NUM_NODES > 1 )); then export NCCL_NET=OFI; fi

# the launch config, and the layout as variables for the payload (see docs/export.md)
export AXOPLAN_PLAN="${AXOPLAN_PLAN:-$PWD/plan.json}"
if [ ! -f "$AXOPLAN_PLAN" ]; then
    echo "job.sh: no launch config at $AXOPLAN_PLAN; submit from the folder holding plan.json, or set AXOPLAN_PLAN" >&2
    exit 1
fi
export AXOPLAN_PLAN_ID=d748ace1cb89
export AXOPLAN_G_INTER=1
export AXOPLAN_G_DATA=8
export AXOPLAN_G_INTRA_R=1
export AXOPLAN_G_INTRA_C=4
export AXOPLAN_G_INTRA_D=8
export AXOPLAN_TP_ORDER=c,r,d
export AXOPLAN_MICRO_BATCH=2
export AXOPLAN_GRAD_ACCUM_STEPS=16
export AXOPLAN_GLOBAL_BATCH=2048
export AXOPLAN_SEQ_LEN=2048
export AXOPLAN_RECOMPUTE=0
export AXOPLAN_CACHE_WEIGHTS=1
export AXOPLAN_ITERATIONS=100

# shellcheck disable=SC2016  # the quoted lines run, and expand, inside every task
srun --cpu-bind=v,mask_cpu=0x00fe000000000000,0xfe00000000000000,0x0000000000fe0000,0x00000000fe000000,0x00000000000000fe,0x000000000000fe00,0x000000fe00000000,0x0000fe0000000000 singularity run "<CONTAINER>" \
    bash -c '
        export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID" WORLD_SIZE="$SLURM_NTASKS"
        mkdir -p "$MIOPEN_USER_DB_PATH" "$MIOPEN_CUSTOM_CACHE_DIR"
        source "<PYTHON_ENV>/bin/activate"
        exec "$@"' axoplan-task \
    python -u -m axoplan run "$AXOPLAN_PLAN"
