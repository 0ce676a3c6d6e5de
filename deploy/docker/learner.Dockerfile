# The learner: GRPO on LoRA with torch on CUDA (bf16), plus the promotion job.
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
WORKDIR /app
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 LITELLM_LOCAL_MODEL_COST_MAP=True
COPY pyproject.toml README.md alembic.ini ./
COPY apprentice ./apprentice
COPY gateway ./gateway
COPY learner ./learner
COPY migrations ./migrations
# torch comes with the image; the range in pyproject (torch>=2.4) accepts it.
RUN pip install --no-cache-dir -e ".[learner]"
CMD ["apprentice", "learner", "--config", "/etc/apprentice/config.yaml"]
