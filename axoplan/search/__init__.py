"""The search over the space, once the cost model has priced it: the rules a candidate must
meet (``feasibility``), the ranking by predicted time (``ranking``) and the advice when nothing
fits (``advice``)."""
