"""The ClientApp's per-process caches: keyed on the config and on the bytes of every file it
names; every partition of the current config kept (no rebuilds when 1000 clients take turns)."""

import json

from flowerbed.clients import runtime
from flowerbed.clients.core.config import to_json
from flowerbed.clients.core.files import content_key, referenced_files
from flowerbed.server.experiment import load_experiment


def _csv(path, flip: bool) -> None:
    rows = ["a,b,y"]
    for i in range(60):
        label = ("yes" if i % 3 else "no") if not flip else ("no" if i % 3 else "yes")
        rows.append(f"{i % 7},{'xy'[i % 2]},{label}")
    path.write_text("\n".join(rows) + "\n")


def _cfg(tmp_path, *extra):
    return load_experiment(
        "quickstart",
        ["engine=inline", "dataset.name=csv", f"dataset.path={tmp_path / 't.csv'}",
         "dataset.label=y", "dataset.numeric=[a]", "dataset.categorical=[b]", *extra],
    )  # fmt: skip


def test_a_rewritten_table_is_read_again(tmp_path):
    _csv(tmp_path / "t.csv", flip=False)
    config_json = to_json(_cfg(tmp_path, "clients.num=2"))
    assert referenced_files(json.loads(config_json)) == [(tmp_path / "t.csv").resolve()]
    first = runtime._entry(config_json)
    assert runtime._entry(config_json) is first
    labels = first.partition(0, 2)["train"].y.clone()
    _csv(tmp_path / "t.csv", flip=True)  # same path, new labels
    second = runtime._entry(config_json)
    assert second is not first
    assert not (second.partition(0, 2)["train"].y == labels).all()


def test_every_partition_of_a_config_is_kept(tmp_path):
    _csv(tmp_path / "t.csv", flip=False)
    cfg = _cfg(tmp_path, "clients.num=20")
    entry = runtime._entry(to_json(cfg))
    parts = [entry.partition(i, 20) for i in range(20)]
    assert all(entry.partition(i, 20) is parts[i] for i in reversed(range(20)))
    assert len(entry.partitions) == 20


def test_content_key_changes_with_the_file_only(tmp_path):
    _csv(tmp_path / "t.csv", flip=False)
    cfg = _cfg(tmp_path).to_dict()  # keys are made of what travels
    key = content_key(cfg)
    assert content_key(json.loads(json.dumps(cfg))) == key
    _csv(tmp_path / "t.csv", flip=True)
    assert content_key(cfg) != key
