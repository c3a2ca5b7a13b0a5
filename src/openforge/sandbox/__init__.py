"""Where the agent runs: the sandbox modes and the protocol between supervisor and executor.

- `protocol`  the result line, its checks, the environment allowlist, every `OPENFORGE_*` name;
- `modes`     which isolation this machine offers (`auto` -> bwrap, namespaces or none);
- `view`      the allowlisted file-system view an isolating mode builds for the agent;
- `bwrap`     that view as a bubblewrap command line;
- `nsinit`    the same view built with user, mount and PID namespaces (no bubblewrap);
- `agent`     run the harness command in a mode, end every process of it, prove none is left;
- `tamper`    digest of the task data the reward reads, checked before scoring.

docs/sandboxing.md has the threat model and what each mode guarantees.
"""
