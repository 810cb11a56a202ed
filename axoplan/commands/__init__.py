"""CLI commands that live outside axoplan/cli.py; each is registered there, one line each."""
