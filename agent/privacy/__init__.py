"""What a device's unit reveals, and the two ways to reveal less (docs/PRIVACY.md).

``clipping`` and ``mechanism``: differential privacy on the device (each gradient clipped and
noised once, before it leaves the device); ``accountant`` and ``plan``: the budget over rounds
(dp-accounting, an optional extra); ``masking``: pairwise masks that cancel in the fleet's sum.
"""
