"""A dashboard with controls runs with the admin's credentials (it publishes on control): the
admin reads the devices' records, their logs and the jobs like the dashboard user, and still
writes none of them (both as acl_file and as dynamic-security roles)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agent.jobs import topics
from agent.transport.mqtt import MqttTransport
from simulate.brokers import MosquittoBroker
from tests.integration.conftest import TransportFactory, collect

pytestmark = pytest.mark.integration
DEVICE = "pi-a"


@pytest.fixture(params=["dynsec", "acl_file"])
def broker(request: pytest.FixtureRequest, mosquitto_factory: Callable[..., MosquittoBroker]) -> MosquittoBroker:
    return mosquitto_factory(dynsec=request.param == "dynsec", devices=[DEVICE])


def test_the_admin_reads_devices_logs_and_jobs_and_writes_none(
        broker: MosquittoBroker, transport_factory: TransportFactory) -> None:
    watched = [f"{topics.ROOT}/devices/#", f"{topics.ROOT}/jobs/#"]
    admin = transport_factory(broker, "admin", watched)
    dashboard = transport_factory(broker, "dashboard", watched)
    device_login = broker.device_credentials(DEVICE)
    device = MqttTransport(device_login.client_id or f"itest-{DEVICE}", broker.url,
                           username=device_login.username, password=device_login.password)
    device.connect([])
    try:
        device.publish(topics.device_log(DEVICE), b'{"level":"error","line":"out of memory"}', reliable=True)
        device.publish(topics.device_record(DEVICE), b'{"id":"pi-a"}', retain=True, reliable=True)
        heard = collect(admin, lambda got: {m.topic for m in got} >= {topics.device_log(DEVICE),
                                                                       topics.device_record(DEVICE)})
        assert {m.topic for m in heard} >= {topics.device_log(DEVICE), topics.device_record(DEVICE)}
        collect(dashboard, lambda got: any(m.topic == topics.device_log(DEVICE) for m in got))
        # The admin's own writes there reach no one (it reads those roots, it does not write them).
        admin.publish(topics.device_log(DEVICE), b'{"line":"forged"}', reliable=True)
        admin.publish(topics.job_spec("forged"), b"{}", retain=True, reliable=True)
        device.publish(topics.device_log(DEVICE), b'{"line":"marker"}', reliable=True)
        after = collect(dashboard, lambda got: any(b"marker" in m.payload for m in got))
        assert not any(b"forged" in m.payload for m in after) and topics.job_spec("forged") not in {
            m.topic for m in after}
    finally:
        device.close()
