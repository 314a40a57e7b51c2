"""Fuzz target: the checkpoint file (store.checkpoint.read_checkpoint)."""

from common import check, fixture_files, main, temp_file
from localmq.store.checkpoint import read_checkpoint


def TestOneInput(data):
    cp = check(read_checkpoint, temp_file(data, "checkpoint"))
    if cp is not None:
        _ = (cp.min_timestamp, cp.min_timestamp_index)  # the derived properties must not raise either


def seeds():
    return fixture_files(lambda r: r.endswith("/checkpoint")) or [bytes(40)]


if __name__ == "__main__":
    main(TestOneInput, seeds)
