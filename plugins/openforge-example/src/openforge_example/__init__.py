"""An example openforge plugin: a one-shot harness, an arithmetic environment, a reward."""
