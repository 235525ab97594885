"""The reproduction suite: scenario files, our values beside the papers', the run file (repro/run.py)."""
