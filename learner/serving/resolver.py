"""vLLM's filesystem LoRA resolver, for the local inference server.

vLLM (`vllm/plugins/lora_resolvers/filesystem_resolver.py`, and `resolve_lora` /
`_check_model` in its OpenAI serving layer) resolves a request for a model name it does not
serve like this, and so does `apprentice serve-model`:

- the plugin is on when `VLLM_PLUGINS` is unset (every installed plugin loads) or names
  `lora_filesystem_resolver`, and `VLLM_LORA_RESOLVER_CACHE_DIR` is set; a value that is not
  an existing directory stops the server at start with vLLM's message;
- resolution happens only with `VLLM_ALLOW_RUNTIME_LORA_UPDATING` true (`1` or `true`);
- `<dir>/<name>` is found when `name` is not absolute, its real path stays inside the real
  path of `<dir>`, it holds `adapter_config.json`, and that file's `peft_type` is `"LORA"` and
  its `base_model_name_or_path` equals the server's `--model` (not its served name);
- a found adapter that fails to load: 400 BadRequestError "LoRA adapter 'NAME' was found but
  could not be loaded."; nothing found: the usual 404 "The model `NAME` does not exist.";
- one lock per name: many first requests for the same name load it once.

`--lora-resolver-dir` turns the same behaviour on without the environment (the local server
always allows runtime LoRA loading).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)

PLUGIN_NAME = "lora_filesystem_resolver"
CACHE_DIR_ENV = "VLLM_LORA_RESOLVER_CACHE_DIR"
PLUGINS_ENV = "VLLM_PLUGINS"
RUNTIME_UPDATING_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
# vLLM's own words when the directory is not one (register_filesystem_resolver).
INVALID_DIR = f"{CACHE_DIR_ENV} must be set to a valid directory for Filesystem Resolver plugin to function"


class FilesystemResolver:
    """Finds `<cache_dir>/<lora_name>` for the base model the server was started with."""

    def __init__(self, cache_dir: str | os.PathLike[str]) -> None:
        directory = Path(cache_dir)
        if not directory.is_dir():
            raise ValueError(INVALID_DIR)
        self.cache_dir = directory
        self._real_dir = os.path.realpath(directory)

    def __repr__(self) -> str:
        return f"FilesystemResolver({str(self.cache_dir)!r})"

    def _path(self, lora_name: str) -> str | None:
        """The real path of `<cache_dir>/<lora_name>`, or None when it would leave the directory."""
        if os.path.isabs(lora_name):
            return None
        path = os.path.realpath(os.path.join(self._real_dir, lora_name))
        if os.path.commonpath([self._real_dir, path]) != self._real_dir:
            return None
        return path

    def resolve(self, base_model_name: str, lora_name: str) -> str | None:
        """The adapter directory to load for `lora_name`, or None when this resolver has none."""
        path = self._path(lora_name)
        if path is None or not os.path.exists(path):
            return None
        config_path = os.path.join(path, "adapter_config.json")
        if not os.path.exists(config_path):
            return None
        try:
            with open(config_path, encoding="utf-8") as handle:
                config = json.load(handle)
        except (OSError, ValueError) as exc:  # vLLM lets this escape as a server error; a 404 is kinder
            log.warning("LoRA resolver: %s is not readable JSON: %s", config_path, exc)
            return None
        if not isinstance(config, dict):
            return None
        if config.get("peft_type") == "LORA" and config.get("base_model_name_or_path") == base_model_name:
            return path
        return None


def _truthy(value: str | None) -> bool:
    return (value or "0").strip().lower() in ("1", "true")


def resolver_from_environment(environ: Mapping[str, str] | None = None) -> FilesystemResolver | None:
    """The resolver vLLM would use with this environment; None when it would resolve nothing.

    Raises ValueError (vLLM's message) when the plugin is on and the directory is not one."""
    env = os.environ if environ is None else environ
    cache_dir = env.get(CACHE_DIR_ENV)
    plugins = env.get(PLUGINS_ENV)
    if not cache_dir or (plugins is not None and PLUGIN_NAME not in plugins.split(",")):
        return None
    resolver = FilesystemResolver(cache_dir)
    if not _truthy(env.get(RUNTIME_UPDATING_ENV)):
        log.warning(
            "%s is set but %s is not true: vLLM would not resolve adapters from it, and neither do we",
            CACHE_DIR_ENV,
            RUNTIME_UPDATING_ENV,
        )
        return None
    return resolver
