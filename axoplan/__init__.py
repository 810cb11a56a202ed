"""axoplan: a performance model and configuration planner for AxoNN's 4D hybrid parallelism.

Importing the package is cheap: submodules are imported where used (``axoplan.search.ranking``,
``axoplan.inputs.machine``, ...); torch is only imported by the executor.
"""

__version__ = "0.1.0"
