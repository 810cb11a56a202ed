"""What a user gives: the machine, the model, the framework profile and the run options.

Each is a frozen pydantic model read from a YAML file or a preset (``machine``, ``model``,
``framework``, ``options``), checked against the plausible range of every number
(``plausible``); ``axes`` is the one list of parallel dimensions they all speak of; ``schema``
holds the shared base and the one-line error formatting; ``parameters`` declares every number of a
machine once (unit, ranges, source, prior, fit bounds), and ``machine_params`` reads and replaces them
by their dotted paths. A machine's ``launcher:`` block (how its
centre runs a job: ``launcher``, with its ``queues`` and ``staging``) is read here too.
"""
