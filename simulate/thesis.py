"""The thesis's measurements, in one place (data only: the benches and reports compare to them)."""

from __future__ import annotations

# Tables 1 and 2: allreduce step (s) on a 32-core server, by timeout T (s) and node count:
# no faults, 1 fault, 2 parallel faults, 2 serial faults.
THESIS_STEP_S = {
    0.5: {7: (0.033, 1.449, 1.495, 2.822), 15: (0.062, 1.510, 1.513, 2.890), 31: (0.091, 1.497, 1.494, 2.880)},
    1.0: {7: (0.034, 2.441, 2.473, 4.839), 15: (0.065, 2.541, 2.498, 4.860), 31: (0.093, 2.509, 2.541, 4.911)},
}
THESIS_COLUMNS = ("no faults", "1 fault", "2 parallel faults", "2 serial faults")
THESIS_ONE_FAULT_T = 2.9  # 1.449-1.510 s with T = 0.5 s (Table 1), over fault-free, in T
THESIS_TWO_SERIAL_T = 5.8  # 2.822-2.890 s with T = 0.5 s
