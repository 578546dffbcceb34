"""The flowerbed ClientApp (Message API): every engine runs exactly this object.

The runtime (torch, the workloads) is imported by the first message, not with this module:
Flower's simulation loads the ClientApp in ``flwr-simulation`` before it starts its Ray backend,
and that process never handles a message (its actors do, and import it as they start:
``apps/ray_warm.py``).
"""

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    from flowerbed.clients.runtime import handle_train

    return handle_train(msg, context)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    from flowerbed.clients.runtime import handle_evaluate

    return handle_evaluate(msg, context)


@app.query()
def query(msg: Message, context: Context) -> Message:
    from flowerbed.clients.runtime import handle_query

    return handle_query(msg, context)
