"""Forwarding to the real TensorBoard event files and a real MLflow file store."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainwatch.exporters.contract.launcher import RankInfo
from trainwatch.exporters.rank.client import TrainingMonitor

INFO = RankInfo("fwd-job", 0, 0, 1, 0)


def test_tensorboard_and_mlflow_receive_every_finite_value(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    # mlflow-skinny has no SQLAlchemy, so no sqlite store: use the local file store, which
    # MLflow 3 only opens when asked explicitly.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    import mlflow
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracking_uri = (tmp_path / "mlruns").as_uri()
    client = MlflowClient(tracking_uri=tracking_uri)
    experiment = client.create_experiment("trainwatch-test",
                                          artifact_location=str(tmp_path / "artifacts"))
    run = client.create_run(experiment)
    monitor = TrainingMonitor(rank_info=INFO, socket_path=str(tmp_path / "none.sock"),
                              control=False, flush_interval=0.05,
                              tensorboard_dir=str(tmp_path / "tb"),
                              mlflow_run_id=run.info.run_id, mlflow_tracking_uri=tracking_uri)
    for step in range(30):
        loss = float("nan") if step == 10 else 1.0 / (step + 1)
        monitor.report(step, loss=loss, lr=0.01, grad_norm=2.0 + step, step_time=0.1)
    monitor.close()

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    losses = events.Scalars("trainwatch/loss")
    assert [e.step for e in losses] == [s for s in range(30) if s != 10]  # NaN left out
    assert losses[0].value == 1.0
    assert [e.value for e in events.Scalars("trainwatch/grad_norm")][-1] == 31.0

    history = client.get_metric_history(run.info.run_id, "loss")
    assert sorted(m.step for m in history) == [s for s in range(30) if s != 10]
    assert {m.value for m in client.get_metric_history(run.info.run_id, "learning_rate")} == {0.01}
    assert monitor.stats()["forward_dropped_batches"] == 0
    assert mlflow.__version__


def test_wandb_offline_run_receives_every_finite_value(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The real wandb client in offline mode (no network): the run file on disk is read back
    record by record."""
    wandb = pytest.importorskip("wandb")
    from tests.training.wandb_files import history_rows
    from trainwatch.exporters.rank.forwarders import WandbForwarder

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    forwarder = WandbForwarder(mode="offline", dir=str(tmp_path), project="trainwatch-test")
    monitor = TrainingMonitor(rank_info=INFO, socket_path=str(tmp_path / "none.sock"),
                              control=False, flush_interval=0.05, forwarders=[forwarder])
    try:
        for step in [*range(20), 15, 16]:  # a rollback: steps go back, W&B must keep them
            loss = float("nan") if step == 10 else 1.0 / (step + 1)
            monitor.report(step, loss=loss, lr=0.01, step_time=0.1)
        # the wandb client's finish writes the run file; on a loaded machine it took longer
        # than close()'s default 10 s, and the file was read before it was written: a long
        # deadline
        monitor.close(timeout=180)
    finally:
        # the run's finish leaves wandb's service process (wandb-core) for the next run of
        # this process: the test started it, the test stops it
        wandb.teardown()

    rows = history_rows(tmp_path)
    losses = [(int(r["trainwatch/step"]), float(r["trainwatch/loss"])) for r in rows
              if "trainwatch/loss" in r]
    assert [s for s, _ in losses] == [s for s in [*range(20), 15, 16] if s != 10]
    assert losses[0] == (0, 1.0)
    assert {float(r["trainwatch/learning_rate"]) for r in rows} == {0.01}
    assert monitor.stats()["forward_dropped_batches"] == 0
