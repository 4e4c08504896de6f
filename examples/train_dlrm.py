"""Launch the DLRM job from Python instead of the CLI and read its report.

    .venv/bin/python examples/train_dlrm.py            # 2 local processes, 200 steps

Same as ``shardwise train --steps 200 --out example-report``; ``launch`` returns rank 0's metrics.
"""

from shardwise.train import TrainConfig
from shardwise.train.launching.launch import launch


def main() -> None:
    cfg = TrainConfig(steps=200, batch_size=256, out="example-report", checkpoint_every=100,
                      dense_parallel="compile", reshard_at=100)
    metrics = launch(cfg, nproc_per_node=2)
    print(f"loss {metrics['loss']['first']:.4f} -> {metrics['loss']['last']:.4f}, "
          f"eval AUC {metrics['auc']['eval']:.4f}, reshard: {metrics['reshard']['status']}")
    print("report:", cfg.out, "(metrics.json, loss.png, load.png, plan.md)")


if __name__ == "__main__":
    main()
