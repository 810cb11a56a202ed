"""Check predictions against measured runs, fit machine parameters to them, and draw both.

* ``records``    measured runs from the executor's JSON lines or a CSV (incl. vTrain's)
* ``metrics``    error and rank-correlation metrics on plain arrays
* ``compare``    recompute each run's prediction and join it with the measurement
* ``calibrate``  least-squares fit of a machine's efficiency and latency parameters
* ``yamledit``   write the calibrated machine YAML, keeping the original's comments
* ``plots``      matplotlib figures (predicted vs measured, breakdowns, scaling)
"""
