"""Executors: where rollouts run in isolation (`local`: a process group per rollout).

`process.py` holds the process-tree hygiene shared by the executor and the in-sandbox
entry point (`openforge.rollout`).
"""
