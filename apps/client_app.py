"""The flowerbed ClientApp (Message API): every engine runs exactly this object."""

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from flowerbed.clients.runtime import handle_evaluate, handle_query, handle_train

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    return handle_train(msg, context)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return handle_evaluate(msg, context)


@app.query()
def query(msg: Message, context: Context) -> Message:
    return handle_query(msg, context)
