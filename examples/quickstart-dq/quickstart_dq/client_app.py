"""quickstart_dq: the ClientApp. Each node uploads a few quantized samples per round."""

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

import dq_flower
from quickstart_dq.task import Net, load_data

# Flower ClientApp
app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Answer a DQ round: select, quantize and upload a few local samples."""
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    trainset, _ = load_data(partition_id, num_partitions)
    # the model is needed only to score samples (scorer "loss"/"gradnorm") or compensate
    return dq_flower.client.dq_train(msg, context, trainset, model=Net())


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the global model on this node's own test rows."""
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    _, testset = load_data(partition_id, num_partitions)
    return dq_flower.client.evaluate(msg, context, testset, model=Net())
