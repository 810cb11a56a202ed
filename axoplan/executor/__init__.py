"""A thin executor that runs a launch config's 4D layout with torch.distributed.

    axoplan run plans/01-2x2x1x1/plan.json --local 4          # 4 CPU ranks (gloo)
    torchrun --nproc-per-node 8 -m axoplan run plan.json      # one process per GPU (NCCL)

Modules (torch is imported only inside this package, and only by the modules that
need it; ``spec``, ``record``, ``launch`` and ``fragment`` can be imported without torch):

* ``spec``      run settings, model scale-down, the checks made before start-up
* ``groups``    the four group families, built from ``Layout.grid()`` (DeviceMesh)
* ``timing``    per-phase timers (wall clock on CPU, CUDA events on GPU)
* ``comm``      timed collectives, synchronous or overlapped
* ``overlap``   Z all-gather prefetch (OAG) and weight caching; deferred reduce-scatter (ORS)
* ``linear4d``  the 4D linear layer (plain and transposed) as an autograd Function, and the one ``Linear``
                (its core, whole bias, and the path's transitions around the core)
* ``model``     the one GPT-style model class, with its path injected
* ``reference`` the reference path (every parameter whole, one process), and how parameters are cut
* ``layers``    the Megatron path: LayerNorm over X, vocab-parallel embedding and cross-entropy over Y
* ``hfmodel``   the hf path: AxoNN's data-parallel <-> 4D transitions
* ``moe``       the mixture-of-experts MLP, whole and as AxoNN's native module
* ``tags``      each parameter tagged with what reduces its gradient
* ``optim``     Adam and SGD with foreach ops (``torch.optim`` would import torch._dynamo)
* ``train``     synthetic data, the training step, gradient reduction, timed iterations
* ``record``    the measured-run record
* ``launch``    local N-rank launcher (forkserver) and torchrun / srun start-up
* ``worker``    what each rank runs
* ``probe``     GEMM and collective measurements on the ranks
* ``fragment``  what the probe measures, and the machine-YAML fragment it writes
* ``axonn_backend``  optional mapping of a plan onto ``axonn.init`` and AxoNN's layers
"""
