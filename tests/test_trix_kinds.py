"""Every TRIX layer kind a .tvn file may hold has its simulator: a tile computation
(`tile_exec.TILE_KINDS`), a data move (`moves.MOVES`) or, for reshape, none (the same bytes
under another shape: no EXEC). A kind added to the format without one fails here, not in a
simulation."""

from onebuild.targets.trix_sim.lower import WINDOWED
from onebuild.targets.trix_sim.moves import MOVES
from onebuild.targets.trix_sim.tile_exec import TILE_KINDS
from onebuild.targets.trix_sim.tvn import LAYER_KINDS
from onebuild.targets.trix_sim.tvn_layers import REQUIRED


def test_every_layer_kind_has_a_simulator():
    assert set(REQUIRED) == LAYER_KINDS
    assert set(TILE_KINDS) | set(MOVES) | {"reshape"} == LAYER_KINDS
    assert not set(TILE_KINDS) & set(MOVES)
    assert set(WINDOWED) <= set(TILE_KINDS)
