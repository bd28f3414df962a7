"""Local-cloud helpers: the spot preemption injector and the time-compressed clock."""
