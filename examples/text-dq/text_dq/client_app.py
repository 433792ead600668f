"""text_dq: the ClientApp. Each node uploads windows of its own text, coded losslessly."""

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

import dq_flower
from text_dq.task import CharTokenizer, load_device_text

# Flower ClientApp
app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Answer a DQ round: upload windows of this node's text that the server lacks."""
    cfg = context.run_config
    text = load_device_text(context.node_config["partition-id"],
                            context.node_config["num-partitions"], cfg["chars-per-device"],
                            cfg["data-dir"], cfg["chapters-per-device"])
    # no model on the node: windows are drawn uniformly among those the server lacks
    return dq_flower.client.dq_train(msg, context, text, window=cfg["window"],
                                     tokenizer=CharTokenizer())
