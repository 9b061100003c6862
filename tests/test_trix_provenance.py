"""The TRIX simulator's byte provenance: labels follow DMAs and EXEC writes, so equal labels
mean equal bytes whatever the data."""

import numpy as np

from onebuild.targets.trix_sim.provenance import Provenance


def test_labels_follow_transfers_and_writes():
    labels = Provenance(blob_bytes=64, dram_bytes=256, sram_bytes=128)
    labels.load(16, 0, 8, 2, 16, 8)  # two 8-byte blocks of the blob, 16 apart, packed
    assert labels.holds_blob(0, 8, 16) and labels.holds_blob(8, 8, 32)
    assert not labels.holds_blob(0, 16, 16)  # the blocks are not one run of the blob
    labels.load(100, 32, 20, 1, 0, 0)  # arena bytes [100, 120)
    before = labels.of_dram(100, 20)
    assert labels.holds(32, before) and not labels.holds(32, labels.of_dram(101, 20))
    labels.wrote(36, 40)  # an EXEC overwrote four of them
    assert not labels.holds(32, before) and labels.holds(40, before[8:])
    labels.store(32, 200, 20, 1, 0, 0)  # to other arena bytes
    assert labels.holds(32, labels.of_dram(200, 20)) and not labels.holds(32, before)
    labels.store(36, 104, 4, 1, 0, 0)  # the overwritten bytes back in place
    assert labels.holds(32, labels.of_dram(100, 4)) and labels.holds(36, labels.of_dram(104, 4))
    assert not np.array_equal(labels.of_dram(104, 4), before[4:8])
    labels.store(0, 8, 8, 1, 0, 0)  # into the blob: nothing is proved from now on
    assert not labels.holds(32, labels.of_sram(32, 20))
