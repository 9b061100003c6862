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


def test_copies_of_a_kept_result_carry_its_labels():
    """EXECs that copy parts of a result the simulator keeps write those parts' labels: two
    copies of the same part hold equal labels, of other parts or fresh writes do not."""
    labels = Provenance(blob_bytes=16, dram_bytes=64, sram_bytes=64)
    result = labels.reserve((2, 3, 4))  # a whole layer's output: 2 channels, 3 rows, 4 bytes
    assert len(np.unique(result)) == 24 and result.min() >= 64  # beyond every DRAM label
    labels.wrote(0, 8, result[:, 1])  # row 1 of both channels
    labels.wrote(8, 16, result[:, 2])
    assert labels.holds(0, result[:, 1]) and labels.holds(8, result[:, 2])
    assert labels.holds(0, result[:, 1:3].transpose(1, 0, 2))  # rows 1-2, row by row
    assert not labels.holds(0, result[:, 1:3])  # channel by channel: other bytes
    labels.wrote(32, 40, result[:, 1])  # the same part again, elsewhere
    assert np.array_equal(labels.of_sram(32, 8), labels.of_sram(0, 8))
    labels.wrote(40, 48)  # fresh bytes
    assert not np.isin(labels.of_sram(40, 8), result).any()
    assert labels.reserve((1,))[0] > labels.of_sram(40, 8).max()
