"""Datasets of the local lm-eval tasks, read from the JSON files beside this one (the tasks' YAML
names a loader as `custom_dataset: !function local_data.<name>`), so no task touches the Hub."""
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _split(name):
    import datasets

    return datasets.DatasetDict({"test": datasets.Dataset.from_list(json.loads((HERE / name).read_text()))})


def capitals(**_metadata):
    return _split("capitals.json")


def arithmetic(**_metadata):
    return _split("arithmetic.json")


def passages(**_metadata):
    return _split("passages.json")
