"""Bare ClientApp: load Adult, take this node's shard, train/evaluate the MLP."""

import torch
from bare_data import load, partition
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

app = ClientApp()


def mlp(in_dim: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(in_dim, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(),
                         nn.Linear(32, 2))  # fmt: skip


def _data(context: Context) -> tuple[torch.Tensor, torch.Tensor]:
    x, y, _, _ = load(str(context.run_config["data-dir"]), int(context.run_config["rows"]))
    pid = int(context.node_config["partition-id"])
    rows = partition(len(y), pid, int(context.node_config["num-partitions"]))
    return torch.from_numpy(x[rows]), torch.from_numpy(y[rows])


@app.train()
def train(msg: Message, context: Context) -> Message:
    torch.set_num_threads(1)
    x, y = _data(context)
    model = mlp(x.shape[1])
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=float(context.run_config["lr"]), momentum=0.9)
    batch = int(context.run_config["batch-size"])
    for idx in torch.randperm(len(y)).split(batch):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                          "metrics": MetricRecord({"num-examples": len(y), "loss": float(loss)})})  # fmt: skip
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    torch.set_num_threads(1)
    x, y = _data(context)
    model = mlp(x.shape[1])
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    with torch.no_grad():
        logits = model(x)
    metrics = {"num-examples": len(y), "loss": float(nn.functional.cross_entropy(logits, y)),
               "accuracy": float((logits.argmax(1) == y).float().mean())}  # fmt: skip
    return Message(content=RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)
