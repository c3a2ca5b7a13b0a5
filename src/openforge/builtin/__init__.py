"""What ships with openforge: the `mini` harness and its agent program, the `demo` and
`tasks` environments, the `checker` reward. `plugin.py` registers them (and the executors,
engines, trainers and recipe) exactly as an external plugin would.

Empty on purpose: the agent programs (`mini_agent`) start in every rollout's sandbox as
`python -m openforge.builtin.<program>`, and all they need from openforge is this package's
name. Registering the plugins here cost each of them 0.35 s of imports (pydantic models,
entry points) before its first model call.
"""
