# The remediation service image for compose: the project without torch (never imported by it).
FROM python:3.11.10-slim-bookworm
WORKDIR /src
COPY pyproject.toml ./
COPY exporters ./exporters
COPY remediation ./remediation
COPY ansible/playbooks/remediation /opt/trainwatch/ansible/remediation
RUN pip install --no-cache-dir '.[stack]' && useradd --system --uid 10001 --home /var/lib/trainwatch trainwatch \
    && mkdir -p /var/lib/trainwatch && chown trainwatch /var/lib/trainwatch
USER 10001
# No EXPOSE: the port is remediation_port in the rendered configuration (compose/render.yml),
# and compose reaches the service on its network without a published port.
