"""Masked partial sums: the masks hide a unit and a subtree's sum, cancel in the fleet's sum,
and survivors cancel a missing member's masks; the two leaks of test_leaks.py find noise."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from agent.model import mlp
from agent.model.data import Dataset, load_mnist
from agent.privacy.masking import (
    FRACTION_BITS,
    MaskingError,
    MaskingMember,
    RecoveryShare,
    add,
    decode,
    encode,
    unmask,
)
from tests.unit.privacy.leaks import recover_image, recover_label_counts

JOB = "masked"
ENCODING_ERROR = 2.0 ** -(FRACTION_BITS + 1)  # per value, rounding to the fixed point


@dataclass(frozen=True)
class StubMemberKeys:
    """agent/protocol/keys.py's MemberKeys interface (own_node, sign, public; verify), over
    real Ed25519 keys: the spec lets tests stub it until the device keys land."""

    own_node: int
    sign: Callable[[bytes], bytes]
    public: Mapping[int, bytes]

    def verify(self, node: int, data: bytes, signature: bytes) -> bool:
        try:
            Ed25519PublicKey.from_public_bytes(self.public[node]).verify(signature, data)
        except Exception:
            return False
        return True


def fleet(n: int, job: str = JOB) -> list[MaskingMember]:
    private = [Ed25519PrivateKey.generate() for _ in range(n)]
    ring = {i: k.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw) for i, k in enumerate(private)}
    members = [MaskingMember.fresh(job, StubMemberKeys(i, private[i].sign, ring)) for i in range(n)]
    announcements = [m.announcement() for m in members]
    for member in members:
        for announcement in announcements:
            if announcement.node != member.node:
                assert member.agree(announcement)
    return members


def test_a_mask_key_is_taken_only_when_the_peers_device_key_signed_it_for_this_job() -> None:
    a, b = fleet(2)
    other_job = fleet(2, job="other")[1].announcement()
    assert not a.agree(other_job)
    forged = b.announcement()
    assert not a.agree(type(forged)(JOB, 1, bytes(32), forged.signature))  # another key, b's signature
    assert not a.agree(fleet(2)[1].announcement())  # node 1 of another ring: not b's device key


def test_the_masks_cancel_in_the_fleets_sum_up_to_the_fixed_point_encoding() -> None:
    members = fleet(7)
    units = np.random.default_rng(0).uniform(-1, 1, (7, 1000)).astype(np.float32)
    total = decode(add(m.mask(units[m.node], round=3) for m in members))
    assert float(np.max(np.abs(total - units.sum(axis=0)))) <= 7 * ENCODING_ERROR + 1e-6
    assert np.array_equal(encode(units[0]), encode(units[0]))


def test_a_subtrees_sum_is_noise_to_the_node_that_holds_it() -> None:
    members = fleet(7)
    units = np.random.default_rng(1).uniform(-1, 1, (7, 1000)).astype(np.float32)
    subtree = [1, 3, 4]  # node 1 and its children: what node 1 forwards to the root
    partial = decode(add(members[i].mask(units[i], round=0) for i in subtree))
    clear = units[subtree].sum(axis=0)
    assert float(np.mean(np.abs(partial - clear) < 1.0)) < 0.01  # spread over +-32,768
    assert abs(float(np.corrcoef(partial, clear)[0, 1])) < 0.1


def test_survivors_cancel_a_crashed_and_a_silent_members_masks() -> None:
    members = fleet(7)
    units = np.random.default_rng(2).uniform(-1, 1, (7, 1000)).astype(np.float32)
    survivors, missing, round = [0, 1, 2, 3, 4], [5, 6], 9  # 5 crashed, 6 went silent
    total = add(members[s].mask(units[s], round) for s in survivors)
    shares = {(sh.survivor, sh.missing): sh for s in survivors for sh in members[s].recovery_shares(missing, round)}
    result = decode(unmask(total, survivors, missing, round, shares))
    assert float(np.max(np.abs(result - units[survivors].sum(axis=0)))) <= 5 * ENCODING_ERROR + 1e-6
    # Without them the sum is noise; a share short or of another round is refused.
    assert float(np.mean(np.abs(decode(total) - units[survivors].sum(axis=0)) < 1.0)) < 0.01
    with pytest.raises(MaskingError, match="member 4 for missing member 6"):
        unmask(total, survivors, missing, round, {k: v for k, v in shares.items() if k != (4, 6)})
    stale = {k: RecoveryShare(round - 1, v.survivor, v.missing, v.seed) for k, v in shares.items()}
    with pytest.raises(MaskingError):
        unmask(total, survivors, missing, round, stale)


def test_a_recovery_share_reveals_one_rounds_seed_of_one_pair_only() -> None:
    members = fleet(3)
    share = members[0].recovery_shares([2], round=5)[0]
    assert share.seed == members[2].round_seed(0, 5)  # the pair agrees
    assert share.seed != members[0].round_seed(2, 6) and share.seed != members[0].round_seed(1, 5)


@pytest.fixture(scope="module")
def mnist(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return load_mnist(cache_dir=tmp_path_factory.mktemp("cache"))


def test_with_masking_the_parent_recovers_no_image_and_no_label_counts(mnist: Dataset) -> None:
    params = mlp.init_params(np.random.default_rng(0))
    child, *_ = fleet(3)  # the child and two other members it agreed masks with
    image = mnist.x_train[7:8]
    _, unit = mlp.loss_and_grad(params, image, mnist.y_train[7:8])
    seen = decode(child.mask(unit, round=0))  # what the parent receives
    blank_guess = float(np.mean(np.abs(image[0])))  # the error of guessing an empty image
    assert float(np.mean(np.abs(recover_image(seen) - image[0]))) > blank_guess
    _, batch_unit = mlp.loss_and_grad(params, mnist.x_train[:100], mnist.y_train[:100])
    counts = recover_label_counts(decode(child.mask(batch_unit, round=1)), params, mnist.x_train[30000:31000], 100)
    true = np.bincount(mnist.y_train[:100], minlength=10)
    uniform_guess = int(np.sum(np.abs(true - 10)))  # chance: ten of each
    assert int(np.sum(np.abs(counts - true))) > uniform_guess
