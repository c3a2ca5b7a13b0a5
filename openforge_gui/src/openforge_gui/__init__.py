"""OpenForgeGUI: screen observations, an action space and parser, a browser environment,
the computer API, the `gui-agent` harness, MiniWoB++ and web task sets, a web judge."""
