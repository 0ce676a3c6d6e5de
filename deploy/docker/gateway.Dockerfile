# The gateway: small and fast to start; no torch.
FROM python:3.11-slim
WORKDIR /app
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 LITELLM_LOCAL_MODEL_COST_MAP=True
COPY pyproject.toml README.md alembic.ini ./
COPY apprentice ./apprentice
COPY gateway ./gateway
COPY learner ./learner
COPY migrations ./migrations
RUN pip install --no-cache-dir -e .
# The journal must live on a disk that survives restarts of this container (see compose/k8s).
VOLUME /var/lib/apprentice
EXPOSE 8000
HEALTHCHECK CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz')"
CMD ["apprentice", "gateway", "--config", "/etc/apprentice/config.yaml", "--host", "0.0.0.0", "--port", "8000", "--workers", "4"]
