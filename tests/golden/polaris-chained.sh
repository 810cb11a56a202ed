#!/bin/bash
# axoplan export, rank 1: 20B on 256 x NVIDIA A100-SXM4-40GB (polaris), 64 nodes
# layout Gx=4 Gy=1 Gz=8 Gdata=8, tensor-parallel order xyz; axonn.init(G_inter=1 G_data=8 G_intra_r=1 G_intra_c=4 G_intra_d=8)
# micro-batch 2, no recompute, cached weights, 16 micro-batches per step; global batch 2048 x 2048 tokens
# predicted 7.250 s/iteration x 2896 iterations + 10 min margin = wall time 06:00:00
# memory per GPU: needs 40.0 GB of tensors, of 31.4 GB usable (40 GB HBM less a 8.6 GB reserve); with the reserve 48.6 GB, 80% interval 42.8-55.2 GB: does not fit (P(fit) 0.03)
# plan b4f659396305; its launch config is plan.json, next to this script
# submit from this folder:  qsub job.sh
#PBS -A <ACCOUNT>
#PBS -q prod
#PBS -l select=64
#PBS -l place=scatter
#PBS -l walltime=06:00:00
#PBS -l filesystems=home:eagle
#PBS -k doe
#PBS -j oe
#PBS -N axoplan-01-x4-y1-z8-d8

set -eo pipefail
cd "$PBS_O_WORKDIR"

module use /soft/modulefiles
module load conda

export NCCL_NET_GDR_LEVEL="PHB"
export NCCL_CROSS_NIC="1"
export NCCL_COLLNET_ENABLE="1"
export NCCL_NET="AWS Libfabric"
export LD_LIBRARY_PATH="/soft/libraries/aws-ofi-nccl/v1.9.1-aws/lib:$LD_LIBRARY_PATH"
export FI_CXI_DISABLE_HOST_REGISTER="1"
export FI_MR_CACHE_MONITOR="userfaultfd"
export FI_CXI_DEFAULT_CQ_SIZE="131072"
export CUDA_DEVICE_MAX_CONNECTIONS="1"
MASTER_ADDR="$(head -n 1 "$PBS_NODEFILE")"
export MASTER_ADDR
export MASTER_PORT="29500"

conda activate
source "<PYTHON_ENV>/bin/activate"

# the launch config, and the layout as variables for the payload (see docs/export.md)
export AXOPLAN_PLAN="${AXOPLAN_PLAN:-$PWD/plan.json}"
if [ ! -f "$AXOPLAN_PLAN" ]; then
    echo "job.sh: no launch config at $AXOPLAN_PLAN; submit from the folder holding plan.json, or set AXOPLAN_PLAN" >&2
    exit 1
fi
export AXOPLAN_PLAN_ID=b4f659396305
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
export AXOPLAN_ITERATIONS=10000

# chained run: 10000 iterations in 4 jobs of at most 2896 iterations, queue prod-medium (limit 360 min [doc ALCF]: medium, 25-99 nodes, 6 h)
export AXOPLAN_JOB_INDEX="${AXOPLAN_JOB_INDEX:-1}"
export AXOPLAN_JOBS=4
export AXOPLAN_TOTAL_ITERATIONS=10000
export AXOPLAN_ITERATIONS=$(( AXOPLAN_JOB_INDEX < AXOPLAN_JOBS ? 2896 : 1312 ))
export AXOPLAN_RESUME=$(( AXOPLAN_JOB_INDEX > 1 ? 1 : 0 ))
export AXOPLAN_SAVE_CHECKPOINT=1  # axoplan run writes checkpoint/ beside the plan; the next job resumes from it
export AXOPLAN_WARMUP=0  # axoplan run: every step counts toward AXOPLAN_TOTAL_ITERATIONS
if (( AXOPLAN_JOB_INDEX < AXOPLAN_JOBS )); then
    qsub -W depend=afterok:"$PBS_JOBID" -V -v AXOPLAN_JOB_INDEX=$(( AXOPLAN_JOB_INDEX + 1 )) "$PBS_O_WORKDIR/job.sh"
fi

# shellcheck disable=SC2016  # the quoted lines run, and expand, inside every task
mpiexec -n 256 --ppn 4 --cpu-bind depth -d 16 \
    bash -c '
        export RANK="$PMI_RANK" LOCAL_RANK="$PALS_LOCAL_RANKID" WORLD_SIZE="$PMI_SIZE"
        exec "$@"' axoplan-task \
    python train.py
