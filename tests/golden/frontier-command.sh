#!/bin/bash
# axoplan export, rank 1: 320B on 32768 x AMD MI250X GCD (frontier), 4096 nodes
# layout Gx=4 Gy=8 Gz=512 Gdata=2, tensor-parallel order xyz; axonn.init(G_inter=1 G_data=2 G_intra_r=8 G_intra_c=4 G_intra_d=512)
# micro-batch 1, no recompute, cached weights, 2 micro-batches per step; global batch 2048 x 2048 tokens
# predicted 12.500 s/iteration x 50 iterations + 15.24 min margin = wall time 00:26:00
# memory per GPU: needs 40.0 GB of tensors, of 51.7 GB usable (64 GB HBM less a 12.3 GB reserve); with the reserve 52.3 GB, 80% interval 46.0-59.4 GB: fits (P(fit) 0.98)
# plan 43f25abb44d1; its launch config is plan.json, next to this script
# submit from this folder:  sbatch job.sh
#SBATCH -A ABC123
#SBATCH -p batch
#SBATCH -q debug
#SBATCH -N 4096
#SBATCH --ntasks-per-node=8
#SBATCH -t 00:26:00
#SBATCH -J axoplan-01-x4-y8-z512-d2
#SBATCH -o %x-%j.out
#SBATCH --network=disable_rdzv_get
#SBATCH -C nvme

set -eo pipefail

module load PrgEnv-gnu/8.7.0
module load cpe/26.03
module load miniforge3/23.11.0-0
module load rocm/7.1.1
module load rccl-net-plugin
module load craype-accel-amd-gfx90a

export LD_LIBRARY_PATH="$CRAY_LD_LIBRARY_PATH:$LD_LIBRARY_PATH"
export NCCL_CROSS_NIC="1"
export NCCL_NET_GDR_LEVEL="PHB"
export NCCL_SOCKET_IFNAME="hsn0,hsn1,hsn2,hsn3"
export HSA_FORCE_FINE_GRAIN_PCIE="1"
export FI_MR_CACHE_MONITOR="kdreg2"
export FI_CXI_DISABLE_HOST_REGISTER="1"
export FI_CXI_DEFAULT_CQ_SIZE="131072"
export FI_CXI_RDZV_PROTO="alt_read"
export FI_CXI_RDZV_EAGER_SIZE="0"
export FI_CXI_RDZV_THRESHOLD="0"
export FI_CXI_RDZV_GET_MIN="0"
export FI_CXI_DEFAULT_TX_SIZE="2048"
export FI_CXI_RX_MATCH_MODE="hybrid"
export CUDA_DEVICE_MAX_CONNECTIONS="1"
export OMP_NUM_THREADS="7"
export MIOPEN_USER_DB_PATH="/tmp/miopen-cache-$SLURM_JOB_ID"
export MIOPEN_CUSTOM_CACHE_DIR="$MIOPEN_USER_DB_PATH"
MASTER_ADDR="$(hostname -i)"
export MASTER_ADDR
export MASTER_PORT="3442"

if (( SLURM_JOB_NUM_NODES > 1 )); then export NCCL_NET=OFI; else export NCCL_NET=Socket; fi
conda activate "envs/torch"

# 4096 nodes >= 1024: stage the Python environment to node-local storage [OLCF Python-on-Frontier guide: sbcast to /mnt/bb; unverified here]
sbcast -pf "envs/torch.tar.gz" "/mnt/bb/$USER/axoplan-env.tar.gz"
srun -N 4096 --ntasks-per-node=1 bash -c "mkdir -p /mnt/bb/$USER/axoplan-env && tar -xzf /mnt/bb/$USER/axoplan-env.tar.gz -C /mnt/bb/$USER/axoplan-env"
conda activate "/mnt/bb/$USER/axoplan-env"

# the launch config, and the layout as variables for the payload (see docs/export.md)
export AXOPLAN_PLAN="${AXOPLAN_PLAN:-$PWD/plan.json}"
if [ ! -f "$AXOPLAN_PLAN" ]; then
    echo "job.sh: no launch config at $AXOPLAN_PLAN; submit from the folder holding plan.json, or set AXOPLAN_PLAN" >&2
    exit 1
fi
export AXOPLAN_PLAN_ID=43f25abb44d1
export AXOPLAN_G_INTER=1
export AXOPLAN_G_DATA=2
export AXOPLAN_G_INTRA_R=8
export AXOPLAN_G_INTRA_C=4
export AXOPLAN_G_INTRA_D=512
export AXOPLAN_TP_ORDER=c,r,d
export AXOPLAN_MICRO_BATCH=1
export AXOPLAN_GRAD_ACCUM_STEPS=2
export AXOPLAN_GLOBAL_BATCH=2048
export AXOPLAN_SEQ_LEN=2048
export AXOPLAN_RECOMPUTE=0
export AXOPLAN_CACHE_WEIGHTS=1
export AXOPLAN_ITERATIONS=50

# shellcheck disable=SC2016  # the quoted lines run, and expand, inside every task
srun -N 4096 -n 32768 --ntasks-per-node=8 -c 7 --gpus-per-task=1 --gpu-bind=closest \
    bash -c '
        export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID" WORLD_SIZE="$SLURM_NTASKS"
        mkdir -p "$MIOPEN_USER_DB_PATH"
        exec "$@"' axoplan-task \
    python train.py --config my.yaml
