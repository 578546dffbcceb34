"""Bare ServerApp: FedAvg over the connected nodes (all, or ``fraction`` of them each round),
central evaluation, a line per round."""

import time

import torch
from bare_client import mlp
from bare_data import load
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    torch.manual_seed(0)
    if context.run_config["indexed-dispatch"]:  # flowerbed's fix of Flower's O(nodes x messages)
        from flowerbed.server.dispatch import install  # hand-out (only flwr imports)

        install()
    _, _, x_test, y_test = load(
        str(context.run_config["data-dir"]), int(context.run_config["rows"])
    )
    x_test, y_test = torch.from_numpy(x_test), torch.from_numpy(y_test)
    model = mlp(x_test.shape[1])
    while (nodes := len(list(grid.get_node_ids()))) < int(context.run_config["num-nodes"]):
        time.sleep(0.5)  # the simulation registers its nodes while the ServerApp starts
    last = [time.perf_counter()]

    def central(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict(arrays.to_torch_state_dict())
        with torch.no_grad():
            accuracy = float((model(x_test).argmax(1) == y_test).float().mean())
        now = time.perf_counter()
        if server_round > 0:
            print(f"BARE-ROUND {server_round} {now - last[0]:.3f} {accuracy:.4f}", flush=True)
        last[0] = now
        return MetricRecord({"accuracy": accuracy})

    fraction = float(context.run_config.get("fraction", 1.0))  # of the nodes, each round
    least = max(1, round(fraction * nodes))
    strategy = FedAvg(
        fraction_train=fraction, fraction_evaluate=fraction, min_train_nodes=least,
        min_evaluate_nodes=least, min_available_nodes=nodes,
    )  # fmt: skip
    strategy.start(
        grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=int(context.run_config["num-server-rounds"]),
        train_config=ConfigRecord({}), evaluate_fn=central,
    )  # fmt: skip
