"""Where the agent runs: the sandbox modes and the protocol between supervisor and executor.

- `protocol`  the result line, its checks, the environment allowlist, the `OPENFORGE_*`
              names the executors, the supervisor and the gateway speak through;
- `modes`     which isolation this machine offers (`auto` -> bwrap, namespaces or none);
- `view`      the allowlisted file-system view an isolating mode builds for the agent;
- `bwrap`     that view as a bubblewrap command line;
- `nsinit`    the same view built with user, mount, PID and network namespaces (no bubblewrap);
- `ports`     the loopback ports an isolated agent may reach (the gateway's, its own services');
- `relay`     the trusted side carrying those ports into the sandbox's network namespace;
- `agent`     run the harness command in a mode, end every process of it, prove none is left;
- `scrub`     remove what the agent left that the trusted side must not follow or open;
- `forgery`   result lines the agent wrote (its output, the supervisor's stdout): a violation;
- `tamper`    digest of the task data the reward reads, checked before scoring;
- `verifier`  run what the agent wrote, for scoring, in a fresh sandbox of the attempt.

docs/sandboxing.md has the threat model and what each mode guarantees.
"""
