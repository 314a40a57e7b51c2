"""Fuzz target: an index file (store.index.IndexFile.open with its geometry inferred, queries, then an insert)."""

from common import check, fixture_files, main, temp_file
from localmq.store.index import IndexFile


def TestOneInput(data):
    path = temp_file(data, "20240101000000000")
    f = check(IndexFile.open, path)
    if f is None:
        return
    try:
        for key in ("abc#k1", "TopicTest#key", "x"):
            check(f.select_phy_offsets, key, 16, 0, 1 << 62)
        check(f.put_key, "abc#k1", 100, 1000)
        check(f.select_phy_offsets, "abc#k1", 16, 0, 1 << 62)
    finally:
        f.close()


def seeds():
    return fixture_files(lambda r: r.endswith("store/100")) or [bytes(8440)]


if __name__ == "__main__":
    main(TestOneInput, seeds)
