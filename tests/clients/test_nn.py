"""The shared networks (clients/nn.py): the state-dict keys and parameter order their callers'
saved and sent models depend on, and the block's causal attention."""

import torch

from flowerbed.clients.nn import PreLNBlock, make_mlp


def test_make_mlp_keys_and_widths():
    model = make_mlp(5, [4, 3], 2)
    assert list(model.state_dict()) == [
        "0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias",
    ]  # fmt: skip
    assert [tuple(p.shape) for p in model.parameters()][::2] == [(4, 5), (3, 4), (2, 3)]
    assert [m.out_features for m in make_mlp() if isinstance(m, torch.nn.Linear)] == [128, 128, 10]


def test_block_parameter_order_and_same_initial_values_either_way():
    torch.manual_seed(0)
    gem_order = PreLNBlock(8, 2)
    torch.manual_seed(0)
    norms_first = PreLNBlock(8, 2, norms_first=True)
    modules = lambda block: list(dict.fromkeys(k.rsplit(".", 1)[0] for k in block.state_dict()))  # noqa: E731
    assert modules(gem_order) == ["ln1", "qkv", "proj", "ln2", "mlp.0", "mlp.2"]
    assert modules(norms_first) == ["ln1", "ln2", "qkv", "proj", "mlp.0", "mlp.2"]
    for key, value in gem_order.state_dict().items():  # layer norms draw no random numbers
        assert torch.equal(value, norms_first.state_dict()[key])


def test_block_attention_is_causal():
    torch.manual_seed(0)
    block = PreLNBlock(8, 2).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    later_changed = x.clone()
    later_changed[:, 3:] += 1.0
    before, after = block(x), block(later_changed)
    torch.testing.assert_close(before[:, :3], after[:, :3], rtol=0, atol=1e-12)
    assert not torch.allclose(before[:, 3:], after[:, 3:])
