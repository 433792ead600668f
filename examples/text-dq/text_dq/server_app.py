"""text_dq: the ServerApp. The server trains the language model on the uploaded text."""

import json
from pathlib import Path

import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

import dq_flower
from text_dq.task import Net, held_out_windows, perplexity

# Create ServerApp
app = ServerApp()

#: the run config keys this app reads itself (the others are DQ's knobs)
APP_KEYS = ["window", "chars-per-device", "chapters-per-device", "held-out-windows",
            "data-dir", "output-dir"]


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Main entry point for the ServerApp."""
    cfg = context.run_config
    num_rounds: int = cfg["num-server-rounds"]
    window: int = cfg["window"]
    held = held_out_windows(window, cfg["held-out-windows"], cfg["data-dir"],
                            cfg["chapters-per-device"])

    def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        """Perplexity of the global model on the devices' held-out chapters."""
        model = Net(window)
        model.load_state_dict(arrays.to_torch_state_dict())
        return MetricRecord({"perplexity": perplexity(model, held)})

    # Load global model
    torch.manual_seed(0)
    global_model = Net(window)
    arrays = ArrayRecord(global_model.state_dict())

    # Initialize the data-quantization strategy (it trains `global_model` on the server on
    # the windows the nodes upload); its knobs come from the run config
    strategy = dq_flower.DQStrategy.from_run_config(global_model, cfg, seed=0,
                                                    app_keys=APP_KEYS)

    # Measure every message's serialized size, then run DQ for `num_rounds`
    measured = dq_flower.MeasuredGrid(grid)
    result = strategy.start(grid=measured, initial_arrays=arrays, num_rounds=num_rounds,
                            evaluate_fn=global_evaluate)

    ppl = {r: float(m["perplexity"]) for r, m in result.evaluate_metrics_serverapp.items()}
    up, down = measured.per_round("up"), measured.per_round("down")
    print(f"\n{len(held)} held-out windows of {window} characters")
    for r in sorted(ppl):
        sent = f", uplink {up.get(r, 0)} bytes" if r else " (the initial model)"
        print(f"round {r}: held-out perplexity {ppl[r]:.2f}{sent}")
    print(f"{strategy.stored} windows stored; uplink {measured.up_bytes} bytes, "
          f"downlink {measured.down_bytes} bytes")

    # Save final model and results to disk
    if cfg["output-dir"]:
        out = Path(str(cfg["output-dir"]))
        out.mkdir(parents=True, exist_ok=True)
        torch.save(result.arrays.to_torch_state_dict(), out / "final_model.pt")
        results = {"perplexity": ppl, "up_bytes": up, "down_bytes": down,
                   "stored": strategy.stored}
        (out / "results.json").write_text(json.dumps(results, indent=2))
