"""How sure a prediction is: intervals and P(best) from the machine's parameter spread and the
model's own error (``intervals``), and their figure (``plot``)."""
