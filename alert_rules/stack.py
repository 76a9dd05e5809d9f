"""Stack alerts: the monitoring and remediation machinery watching itself."""

from __future__ import annotations

from alert_rules.config import Profile
from alert_rules.model import Alert, Group, alert_groups
from alert_rules.promql import new_events, sel, with_node
from trainwatch.exporters.contract import catalog

ACTION_FAILED = 'result="failed"'


def groups(p: Profile) -> list[Group]:
    failed = p.alert("RemediationActionFailed")
    notify = p.alert("AlertmanagerNotificationsFailing")
    am = p.selector("alertmanager")
    by = "sum by (job, instance, integration)"
    alerts = [
        Alert(
            "TargetDown",
            with_node(f'up{{job!~"{p.values["target_down_jobs_excluded"]}"}} == 0'),
            "warning", "stack",
            "Scrape target {{ $labels.job }} at {{ $labels.instance }} is down",
            "Prometheus cannot scrape {{ $labels.job }} at {{ $labels.instance }} for "
            f"{p.alert('TargetDown')['for']}. Alerts that depend on its metrics cannot fire "
            "until it is back.",
            for_=p.alert("TargetDown")["for"],
        ),
        Alert(
            "RemediationActionFailed",
            with_node(new_events(sel(catalog.REMEDIATION_ACTIONS, p.selector("remediation"),
                                     ACTION_FAILED), failed["window"])),
            "warning", "stack",
            "Remediation {{ $labels.playbook }}/{{ $labels.action }} failed",
            "The remediation service failed to run action {{ $labels.action }} of playbook "
            f"{{{{ $labels.playbook }}}} within the last {failed['window']}. The problem it was "
            "meant to fix is still there: handle the original alert by hand and read the "
            "audit log (`trainwatch incidents`).",
            for_=failed["for"],
        ),
        Alert(
            "RemediationCircuitBreakerOpen",
            with_node(f"{sel(catalog.REMEDIATION_CIRCUIT_BREAKER_OPEN, p.selector('remediation'))}"
                      " > 0"),
            "warning", "stack",
            "Remediation circuit breaker is open",
            "Too many remediation actions ran or failed in a short time, so the remediation "
            "service stopped acting automatically. Alerts still arrive, but nothing is fixed "
            "for you until the breaker closes: handle alerts by hand.",
            for_=p.alert("RemediationCircuitBreakerOpen")["for"],
        ),
        Alert(
            "AlertmanagerNotificationsFailing",
            with_node(f"{by} (rate({sel(catalog.AM_NOTIFICATIONS_FAILED, am)}"
                      f"[{notify['window']}]))\n"
                      f"/\n{by} (rate({sel(catalog.AM_NOTIFICATIONS, am)}[{notify['window']}]))\n"
                      f"> {notify['threshold_ratio']}"),
            "critical", "stack",
            "Alertmanager fails to send {{ $labels.integration }} notifications",
            "{{ $value | humanizePercentage }} of Alertmanager's {{ $labels.integration }} "
            "notifications from {{ $labels.instance }} failed over the last "
            f"{notify['window']}. Pages or remediation webhooks may not be arriving: check "
            "the receiver's credentials and reachability in the Alertmanager log.",
            for_=notify["for"],
        ),
        Alert(
            "Watchdog",
            "vector(1)",
            "info", "stack",
            "Watchdog: the alerting pipeline works",
            "This alert always fires. It goes to a dead man's switch outside Trainwatch, which "
            "raises an alarm when it stops arriving (Prometheus or Alertmanager is down).",
        ),
    ]
    return alert_groups("stack", alerts, p.alert_interval, p.alert_group_suffix)
