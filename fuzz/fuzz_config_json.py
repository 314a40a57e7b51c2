"""Fuzz target: RocketMQ config JSON files (store.config_json.read_config_json: the file, then its .bak)."""

from common import check, fixture_files, main, temp_file
from localmq.store.config_json import read_config_json


def TestOneInput(data):
    check(read_config_json, temp_file(data, "topics.json"))


def seeds():
    return fixture_files(lambda r: ".json" in r) or [b"{}"]


if __name__ == "__main__":
    main(TestOneInput, seeds)
