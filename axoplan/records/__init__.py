"""What is written down and read back: the launch config of one layout (``plan``) and the
measured-run record of running it (``runs``)."""
