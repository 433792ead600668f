"""quickstart_dq: the ServerApp. The server trains the model on the uploaded samples."""

import json
from pathlib import Path

import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

import dq_flower
from quickstart_dq.task import Net, load_centralized_testset, test

# Create ServerApp
app = ServerApp()


def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    """Evaluate the global model on the central test rows."""
    model = Net()
    model.load_state_dict(arrays.to_torch_state_dict())
    loss, accuracy = test(model, load_centralized_testset())
    return MetricRecord({"accuracy": accuracy, "loss": loss})


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Main entry point for the ServerApp."""
    # Read run config
    cfg = context.run_config
    num_rounds: int = cfg["num-server-rounds"]

    # Load global model
    torch.manual_seed(0)
    global_model = Net()
    arrays = ArrayRecord(global_model.state_dict())

    # Initialize the data-quantization strategy (it trains `global_model` on the server);
    # its knobs (bits, budget, scorer, ...) come from the run config
    strategy = dq_flower.DQStrategy.from_run_config(global_model, cfg, seed=0,
                                                    app_keys=["output-dir"])

    # Measure every message's serialized size, then run DQ for `num_rounds`
    measured = dq_flower.MeasuredGrid(grid)
    result = strategy.start(
        grid=measured,
        initial_arrays=arrays,
        num_rounds=num_rounds,
        evaluate_fn=global_evaluate,
    )

    central = {r: dict(m) for r, m in result.evaluate_metrics_serverapp.items()}
    print(f"\nFinal accuracy {central[num_rounds]['accuracy']:.3f}, "
          f"uplink {measured.up_bytes} bytes, downlink {measured.down_bytes} bytes")

    # Save final model and results to disk
    if cfg["output-dir"]:
        out = Path(str(cfg["output-dir"]))
        out.mkdir(parents=True, exist_ok=True)
        print(f"Saving final model and results to {out} ...")
        torch.save(result.arrays.to_torch_state_dict(), out / "final_model.pt")
        results = {
            "central": central,
            "federated": {r: dict(m) for r, m in result.evaluate_metrics_clientapp.items()},
            "up_bytes": measured.per_round("up"),
            "down_bytes": measured.per_round("down"),
        }
        (out / "results.json").write_text(json.dumps(results, indent=2))
