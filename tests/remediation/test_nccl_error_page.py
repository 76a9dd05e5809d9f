"""The shipped nccl_error_page playbook pages once per job for TrainingNcclError."""

from tests.remediation.helpers import alert, auth, payload, stub_server


def test_nccl_error_pages_the_on_call_once(service_factory) -> None:
    with stub_server() as (hostport, pager), \
            service_factory(pager_url=f"http://{hostport}/page") as svc:
        for _ in range(2):  # the resend is deduplicated, then cooled down
            svc.client.post("/v1/alerts", json=payload(alert("TrainingNcclError",
                                                             {"training_job": "llm"})),
                            headers=auth())
            svc.wait_idle()
        (page,) = pager.posts("/page")
        assert page.body == {"event": "training_nccl_error", "training_job": "llm"}
        assert [r["playbook"] for r in svc.audit("acted")] == ["nccl_error_page"]
