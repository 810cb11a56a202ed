#!/bin/bash
# axoplan export, rank 1: llama3.1-70B on 768 x Intel Data Center GPU Max 1550 tile (aurora), 64 nodes
# layout Gx=4 Gy=1 Gz=8 Gdata=24, tensor-parallel order xyz; axonn.init(G_inter=1 G_data=24 G_intra_r=1 G_intra_c=4 G_intra_d=8)
# micro-batch 1, no recompute, cached weights, 8 micro-batches per step; global batch 1536 x 2048 tokens
# predicted 11.400 s/iteration x 100 iterations + 10 min margin = wall time 00:29:00
# memory per GPU: needs 40.0 GB of tensors, of 52.6 GB usable (64 GB HBM less a 11.4 GB reserve); with the reserve 51.4 GB, 80% interval 45.2-58.4 GB: fits (P(fit) 0.99)
# plan 3454f66a50c4; its launch config is plan.json, next to this script
# submit from this folder:  qsub job.sh
#PBS -A <ACCOUNT>
#PBS -q prod
#PBS -l select=64
#PBS -l place=scatter
#PBS -l walltime=00:29:00
#PBS -l filesystems=flare:home
#PBS -k doe
#PBS -j oe
#PBS -N axoplan-01-x4-y1-z8-d24

set -eo pipefail
cd "$PBS_O_WORKDIR"

module use /soft/modulefiles
module load frameworks

export ZE_FLAT_DEVICE_HIERARCHY="FLAT"
export CCL_PROCESS_LAUNCHER="pmix"
export CCL_ATL_TRANSPORT="mpi"
export CCL_KVS_MODE="mpi"
export CCL_ALLREDUCE_SCALEOUT="direct:0-1048576;rabenseifner:1048577-max"
export CCL_BCAST="double_tree"
export CCL_WORKER_AFFINITY="42,43,44,45,46,47,94,95,96,97,98,99"
export FI_CXI_RX_MATCH_MODE="hybrid"
export FI_CXI_OFLOW_BUF_SIZE="8388608"
export FI_CXI_DEFAULT_CQ_SIZE="1048576"
export FI_CXI_CQ_FILL_PERCENT="30"
export FI_MR_CACHE_MONITOR="userfaultfd"
MASTER_ADDR="$(head -n 1 "$PBS_NODEFILE")"
export MASTER_ADDR
export MASTER_PORT="2345"

source "<PYTHON_ENV>/bin/activate"

# the launch config, and the layout as variables for the payload (see docs/export.md)
export AXOPLAN_PLAN="${AXOPLAN_PLAN:-$PWD/plan.json}"
if [ ! -f "$AXOPLAN_PLAN" ]; then
    echo "job.sh: no launch config at $AXOPLAN_PLAN; submit from the folder holding plan.json, or set AXOPLAN_PLAN" >&2
    exit 1
fi
export AXOPLAN_PLAN_ID=3454f66a50c4
export AXOPLAN_G_INTER=1
export AXOPLAN_G_DATA=24
export AXOPLAN_G_INTRA_R=1
export AXOPLAN_G_INTRA_C=4
export AXOPLAN_G_INTRA_D=8
export AXOPLAN_TP_ORDER=c,r,d
export AXOPLAN_MICRO_BATCH=1
export AXOPLAN_GRAD_ACCUM_STEPS=8
export AXOPLAN_GLOBAL_BATCH=1536
export AXOPLAN_SEQ_LEN=2048
export AXOPLAN_RECOMPUTE=0
export AXOPLAN_CACHE_WEIGHTS=1
export AXOPLAN_ITERATIONS=100

# shellcheck disable=SC2016  # the quoted lines run, and expand, inside every task
mpiexec -n 768 --ppn 12 --cpu-bind=verbose,list:4-7:8-11:12-15:16-19:20-23:24-27:56-59:60-63:64-67:68-71:72-75:76-79 \
    bash -c '
        export RANK="$PMI_RANK" LOCAL_RANK="$PALS_LOCAL_RANKID" WORLD_SIZE="$PMI_SIZE"
        exec "$@"' axoplan-task \
    python train.py
