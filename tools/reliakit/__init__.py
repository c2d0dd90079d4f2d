"""The reliability runner's parts (tools/reliability.py is the command): requests and what they
expect, the streaming client, the daemon it spawns, the trace join, the strict checks, the
scenarios, the artifact and its schema."""
