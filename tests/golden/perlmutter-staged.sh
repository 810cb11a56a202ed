#!/bin/bash
# axoplan export, rank 1: 80B on 2048 x NVIDIA A100-SXM4-40GB (perlmutter), 512 nodes
# layout Gx=4 Gy=1 Gz=64 Gdata=8, tensor-parallel order xyz; axonn.init(G_inter=1 G_data=8 G_intra_r=1 G_intra_c=4 G_intra_d=64)
# micro-batch 1, no recompute, cached weights, 4 micro-batches per step; global batch 2048 x 2048 tokens
# predicted 3.500 s/iteration x 100 iterations + 11.28 min margin = wall time 00:18:00
# memory per GPU: needs 40.0 GB of tensors, of 31.4 GB usable (40 GB HBM less a 8.6 GB reserve); with the reserve 48.6 GB, 80% interval 42.8-55.2 GB: does not fit (P(fit) 0.03)
# plan 9c2f37839139; its launch config is plan.json, next to this script
# submit from this folder:  sbatch job.sh
#SBATCH -A m1234_g
#SBATCH -C gpu
#SBATCH -q regular
#SBATCH -N 512
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH -c 32
#SBATCH -t 00:18:00
#SBATCH -J axoplan-01-x4-y1-z64-d8
#SBATCH -o %x-%j.out

set -eo pipefail

module load PrgEnv-gnu
module load cray-mpich
module load craype-accel-nvidia80
module load cudatoolkit/12.4
module load nccl

export NCCL_NET="AWS Libfabric"
export NCCL_NET_GDR_LEVEL="PHB"
export NCCL_CROSS_NIC="1"
export NCCL_SOCKET_IFNAME="hsn"
export FI_CXI_RDZV_THRESHOLD="0"
export FI_CXI_RDZV_GET_MIN="0"
export FI_CXI_RDZV_EAGER_SIZE="0"
export CUDA_DEVICE_MAX_CONNECTIONS="1"
MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
export MASTER_ADDR
export MASTER_PORT="29500"

# 512 nodes >= 256: stage the Python environment to node-local storage [conda-pack docs: tar -xzf, source bin/activate, conda-unpack; sbcast to node-local /tmp unverified here]
sbcast -pf "envs/torch.tar.gz" "/tmp/axoplan-env-$SLURM_JOB_ID.tar.gz"
srun -N 512 --ntasks-per-node=1 bash -c "mkdir -p /tmp/axoplan-env-$SLURM_JOB_ID && tar -xzf /tmp/axoplan-env-$SLURM_JOB_ID.tar.gz -C /tmp/axoplan-env-$SLURM_JOB_ID && source /tmp/axoplan-env-$SLURM_JOB_ID/bin/activate && conda-unpack"
source "/tmp/axoplan-env-$SLURM_JOB_ID/bin/activate"

# the launch config, and the layout as variables for the payload (see docs/export.md)
export AXOPLAN_PLAN="${AXOPLAN_PLAN:-$PWD/plan.json}"
if [ ! -f "$AXOPLAN_PLAN" ]; then
    echo "job.sh: no launch config at $AXOPLAN_PLAN; submit from the folder holding plan.json, or set AXOPLAN_PLAN" >&2
    exit 1
fi
export AXOPLAN_PLAN_ID=9c2f37839139
export AXOPLAN_G_INTER=1
export AXOPLAN_G_DATA=8
export AXOPLAN_G_INTRA_R=1
export AXOPLAN_G_INTRA_C=4
export AXOPLAN_G_INTRA_D=64
export AXOPLAN_TP_ORDER=c,r,d
export AXOPLAN_MICRO_BATCH=1
export AXOPLAN_GRAD_ACCUM_STEPS=4
export AXOPLAN_GLOBAL_BATCH=2048
export AXOPLAN_SEQ_LEN=2048
export AXOPLAN_RECOMPUTE=0
export AXOPLAN_CACHE_WEIGHTS=1
export AXOPLAN_ITERATIONS=100

# shellcheck disable=SC2016  # the quoted lines run, and expand, inside every task
srun -N 512 -n 2048 -c 32 --cpu-bind=cores --gpus-per-node=4 \
    bash -c '
        export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID" WORLD_SIZE="$SLURM_NTASKS"
        exec "$@"' axoplan-task \
    python -u -m axoplan run "$AXOPLAN_PLAN"
