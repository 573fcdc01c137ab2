"""How RAPL stores what is written to a powercap limit file (lab only).

The MSR holds a power limit in units of 1/2^PU W and a time window as
2^Y * (1 + F/4) time units of 1/2^TU s, so the kernel reads back the value it
could encode, not the one written. These follow the kernel's own conversion
(drivers/powercap/intel_rapl_common.c: rapl_unit_xlate truncates the power,
rapl_compute_time_window_core encodes Y and F), with the units from
MSR_RAPL_POWER_UNIT given in params.yml.
"""

from __future__ import annotations


def power_unit_uw(power_unit_bits: int) -> int:
    return 1000000 >> power_unit_bits


def time_unit_us(time_unit_bits: int) -> int:
    return 1000000 // (1 << time_unit_bits)


def quantize_power_uw(uw: int, power_unit_bits: int) -> int:
    unit = power_unit_uw(power_unit_bits)
    return min(uw // unit, 0x7FFF) * unit


def quantize_window_us(us: int, time_unit_bits: int) -> int:
    unit = time_unit_us(time_unit_bits)
    if us < unit:
        return 0
    units = us // unit
    y = units.bit_length() - 1
    if y > 0x1F:
        y, f = 0x1F, 3
    else:
        f = 4 * (units - (1 << y)) // (1 << y)
    return (1 << y) * (4 + f) * unit // 4
