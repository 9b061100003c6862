"""PRelu of the integer reference: two requantizations chosen by the input's sign, as TFLite's
and onert's quantized PRELU compute it (rules in docs/quantization.md, "PRelu").

With c = q_x - zp_x and a = q_slope - zp_slope (the slope quantized in the activations' type,
broadcast like a binary operand: one per channel or one for all):
y = requantize(c, s_x / s_y) where c >= 0, else requantize(c * a, s_x s_slope / s_y); then
the output zero point is added and the result saturated.
"""

import numpy as np

from ..quant.params import requantize
from .quantized import _centered, _output, _typed
from .registry import BROADCASTING, broadcast, register


@register("QPRelu", _typed(broadcast), batch=BROADCASTING, quantizes=("PRelu",))
def q_prelu(attrs, x, slope):
    centered = _centered(x, attrs["x_zero_point"])
    a = slope.astype(np.int64) - attrs["slope_zero_point"]
    positive = requantize(centered, attrs["multiplier"], attrs["shift"])
    negative = requantize(centered * a, attrs["slope_multiplier"], attrs["slope_shift"])
    return _output(attrs, np.where(centered >= 0, positive, negative))
