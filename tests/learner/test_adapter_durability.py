"""A saved adapter is whole on disk the moment its name exists, even if the power fails then."""

from __future__ import annotations

import pytest
import torch

from apprentice.promotion.files import adapter_files_problem
from learner.grpo.adapters import check_vllm_format, new_lora, save_adapter
from tests.support.power_loss import Crash, PowerLoss


def test_an_adapter_renamed_into_place_survives_a_power_loss_byte_for_byte(tiny_model_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = new_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), 8, 16, ["q_proj"])
    disk = PowerLoss(monkeypatch)
    disk.crash_after_rename("replace")

    with pytest.raises(Crash):
        save_adapter(model, tmp_path / "adapters" / "p-v1", "HuggingFaceTB/SmolLM2-135M-Instruct")

    assert disk.renamed == tmp_path / "adapters" / "p-v1"
    after_reboot = disk.rebuild(disk.renamed, tmp_path / "after-reboot")
    assert adapter_files_problem(after_reboot) is None
    check_vllm_format(after_reboot)
    written = sorted(p.name for p in disk.renamed.iterdir())
    assert sorted(p.name for p in after_reboot.iterdir()) == written
    for name in written:  # every byte the page cache held reached the disk before the name did
        assert (after_reboot / name).read_bytes() == (disk.renamed / name).read_bytes(), name
