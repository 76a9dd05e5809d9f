"""Structured logging for training ranks and a scanner that turns log failures into metrics.

`exporters.logs.handler.AsyncEcsHandler` writes ECS JSON lines without slowing the caller;
`exporters.logs.scanner` classifies failure messages; `trainwatch-logscan` exports them.
"""
