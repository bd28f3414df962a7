"""What runs on every node: the resumable DDP trainer and the preemption agent."""
