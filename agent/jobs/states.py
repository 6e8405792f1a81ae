"""The closed sets of a device's and an execution's states, and why a job is refused."""

from __future__ import annotations

import enum


class ExecState(enum.StrEnum):
    """One device's execution of one job (AWS IoT Jobs style), on its retained exec topic."""

    QUEUED = "queued"  # the device holds the job and runs it after the ones before it
    ACCEPTED = "accepted"  # checked: data source, backend, memory, signature, model
    REJECTED = "rejected"  # with a RejectReason; the device stays ready for the next job
    DOWNLOADING = "downloading"  # fetching the model file's chunks
    TRAINING = "training"  # with the round
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # with the log line
    CANCELED = "canceled"  # a signed stop control before or during training
    TIMED_OUT = "timed_out"  # the stop rule's deadline passed

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({ExecState.REJECTED, ExecState.SUCCEEDED, ExecState.FAILED,
                      ExecState.CANCELED, ExecState.TIMED_OUT})


class RejectReason(enum.StrEnum):
    """Why a device refused a job (or a control, or a blob chunk): counted in its record."""

    BAD_SIGNATURE = "bad_signature"
    UNKNOWN_KEY = "unknown_key"
    NO_DATA_SOURCE = "no_data_source"
    BACKEND_MISSING = "backend_missing"
    NOT_ENOUGH_MEMORY = "not_enough_memory"
    MODEL_CHECK_FAILED = "model_check_failed"
    BLOB_HASH_MISMATCH = "blob_hash_mismatch"
    INVALID_DOCUMENT = "invalid_document"
    DEVICE_KEY_MISMATCH = "device_key_mismatch"  # the job pins another key than this device's


class DeviceState(enum.StrEnum):
    """What the device record says the device is doing."""

    IDLE = "idle"
    TRAINING = "training"
    OFFLINE = "offline"  # the record's Last Will


class ControlAction(enum.StrEnum):
    """What the operator's signed control message on a job asks."""

    STOP = "stop"
