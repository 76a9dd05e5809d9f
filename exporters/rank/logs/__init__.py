"""Structured logging inside a rank: `AsyncEcsHandler` writes ECS JSON lines without slowing
the caller (`handler`, `ecs`, `ecs_compat`, `rotating_writer`, `shutdown_hooks`)."""
