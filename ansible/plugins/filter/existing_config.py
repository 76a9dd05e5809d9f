"""`trainwatch.stack.prometheus_merge` and `trainwatch.stack.alertmanager_merge`: what the
prometheus and alertmanager roles' existing mode (a site's own server) writes into the site's
configuration file.

Each takes the file's text as it is and Trainwatch's part, and returns {text, error}: `text` the
file with Trainwatch's part merged in (the unchanged text when it already has it, so a second
run changes nothing), `error` a message for the operator when the merge would take something of
theirs (a scrape job or receiver of the same name) or the file is not a YAML mapping. A filter,
not a module: the merge is pure data and runs on the controller, where PyYAML comes with
Ansible.

What is kept of the site's file: every key, job, receiver and route, in their order, with their
values. What is not: comments and formatting, once Trainwatch's part has to be added (the roles
keep a backup of the file beside it).
"""

from __future__ import annotations

import json
from typing import Any

import yaml


def _plain(value: Any) -> Any:
    """Ansible's tagged strings and lists as plain Python ones, which yaml.safe_dump writes."""
    return json.loads(json.dumps(value))


def _load(text: str, what: str) -> tuple[dict[str, Any], str]:
    try:
        config = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        return {}, f"{what} is not valid YAML: {exc}"
    if not isinstance(config, dict):
        return {}, f"{what} is not a YAML mapping"
    return config, ""


def _result(text: str, before: dict[str, Any], after: dict[str, Any]) -> dict[str, str]:
    if after == before:
        return {"text": text, "error": ""}
    return {"text": yaml.safe_dump(after, sort_keys=False, default_flow_style=False, width=1000),
            "error": ""}


def _is_trainwatch_job(job: Any, targets_dir: str) -> bool:
    """A job Trainwatch wrote: its only service discovery is file_sd over files in
    Trainwatch's targets directory."""
    if not isinstance(job, dict) or not job.get("file_sd_configs"):
        return False
    if any(key.endswith("_sd_configs") and key != "file_sd_configs" for key in job) \
            or "static_configs" in job:
        return False
    prefix = targets_dir.rstrip("/") + "/"
    return all(str(path).startswith(prefix)
               for sd in job["file_sd_configs"] for path in (sd or {}).get("files", []))


def prometheus_merge(text: str, jobs: list[dict[str, Any]], rule_glob: str,
                     targets_dir: str) -> dict[str, str]:
    """The site's prometheus.yml with one `rule_files` entry (`rule_glob`) and Trainwatch's
    scrape `jobs` (file_sd over `targets_dir`); Trainwatch's jobs of an earlier run are
    replaced, the site's own jobs kept as they are, a site job named like one of Trainwatch's
    refused."""
    before, error = _load(str(text), "The Prometheus configuration")
    if error:
        return {"text": str(text), "error": error}
    jobs, rule_glob, targets_dir = _plain(jobs), str(rule_glob), str(targets_dir)
    after = json.loads(json.dumps(before, default=str))
    site_jobs = [job for job in after.get("scrape_configs") or []
                 if not _is_trainwatch_job(job, targets_dir)]
    ours = {job["job_name"] for job in jobs}
    clashes = sorted(ours & {job.get("job_name") for job in site_jobs if isinstance(job, dict)})
    if clashes:
        return {"text": str(text), "error": (
            f"The Prometheus configuration already has scrape job(s) {', '.join(clashes)} that "
            "Trainwatch did not write (their targets are not file_sd files in "
            f"{targets_dir}). Trainwatch's rules select its targets by these job names, so it "
            "will not take them over: rename your job, or leave the job out of Trainwatch's "
            "with prometheus_scrape_groups (when yours already scrapes the same exporters under "
            "that name). Nothing was changed.")}
    after["scrape_configs"] = site_jobs + jobs
    rule_files = list(after.get("rule_files") or [])
    if rule_glob not in rule_files:
        rule_files.append(rule_glob)
    after["rule_files"] = rule_files
    return _result(str(text), before, after)


def _credentials(receiver: dict[str, Any]) -> set[str]:
    return {str(((hook.get("http_config") or {}).get("authorization") or {})
                .get("credentials_file", ""))
            for hook in receiver.get("webhook_configs") or []}


def alertmanager_merge(text: str, rendered: dict[str, Any], receiver: str, install_name: str,
                       label: dict[str, str]) -> dict[str, str]:
    """The site's alertmanager.yml with Trainwatch's remediation receiver (named `receiver`)
    and its routes first under the root route, taken from `rendered`, the install mode's own
    configuration (alert_rules/alertmanager.yml.j2) where they are called `install_name`.

    In the install mode every alert is Trainwatch's, so its catch-all remediation route has no
    matcher; here it gets the `label` every Trainwatch rule carries, and `continue: true`, so
    the site's own routing still sees every alert. The site's receivers and routes are kept;
    a receiver of the same name that is not Trainwatch's (webhooks with Trainwatch's token file
    only) is refused."""
    before, error = _load(str(text), "The Alertmanager configuration")
    if error:
        return {"text": str(text), "error": error}
    if not isinstance(before.get("route"), dict):
        return {"text": str(text), "error": "The Alertmanager configuration has no root route"}
    rendered, receiver, install_name = _plain(rendered), str(receiver), str(install_name)
    after = json.loads(json.dumps(before, default=str))
    found = [dict(r, name=receiver) for r in rendered.get("receivers") or []
             if isinstance(r, dict) and r.get("name") == install_name]
    if len(found) != 1:
        return {"text": str(text), "error": (
            f"Trainwatch's own Alertmanager configuration has {len(found)} receivers named "
            f"{install_name} instead of one: the collection is broken. Nothing was changed.")}
    [ours] = found
    matchers = [f'{name}="{value}"' for name, value in sorted(_plain(label).items())]
    routes = []
    for route in rendered["route"].get("routes") or []:
        if route.get("receiver") != install_name:
            continue
        route = dict(route, receiver=receiver)
        if not route.get("matchers"):
            route = {"receiver": receiver, "matchers": matchers, **route, "continue": True}
        routes.append(route)
    site_receivers = []
    for existing in after.get("receivers") or []:
        if isinstance(existing, dict) and existing.get("name") == receiver:
            if set(existing) - {"name", "webhook_configs"} \
                    or not _credentials(existing) <= _credentials(ours):
                return {"text": str(text), "error": (
                    f"The Alertmanager configuration already has a receiver named {receiver} "
                    "that Trainwatch did not write. Rename yours, or give Trainwatch's another "
                    "name with alertmanager_existing_receiver. Nothing was changed.")}
            continue
        site_receivers.append(existing)
    site_routes = [route for route in after["route"].get("routes") or []
                   if not (isinstance(route, dict) and route.get("receiver") == receiver)]
    after["receivers"] = site_receivers + ([ours] if routes else [])
    after["route"]["routes"] = routes + site_routes
    if not after["route"]["routes"]:
        del after["route"]["routes"]
    return _result(str(text), before, after)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"prometheus_merge": prometheus_merge, "alertmanager_merge": alertmanager_merge}
