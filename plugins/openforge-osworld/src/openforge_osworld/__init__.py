"""openforge-osworld: OSWorld desktop tasks on DesktopEnv, behind openforge_gui's computer API."""
